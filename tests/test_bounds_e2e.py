"""Issue 20 end to end on the real server (the shared e2e server): the schema that killed the
engine is a 400 every time and the engine lives on; a bad constraint is the same 400 streamed
or not; tool parameters must be an object schema; request JSON, schemas, regexes and grammars
nested at any depth get a 400 naming the limit, never a 500 or a dropped connection."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from typing import Any

import pytest
from server_helpers import http_get, http_post

pytestmark = pytest.mark.model

NODE = {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"]}
OOM_SCHEMA = {"$defs": {"a": NODE}, "$ref": "#/$defs/a"}
REF_PATH = '$["$defs"].a.properties.x'
DEPTHS = [150, 250, 300, 1000, 5000]


@pytest.fixture(scope="module")
def url(e2e_server: dict[str, Any]) -> str:
    return str(e2e_server["url"])


def _chat(**patch: Any) -> dict[str, Any]:
    body = {"model": "m", "messages": [{"role": "user", "content": "Give me JSON."}],
            "max_tokens": 8}
    body.update(patch)
    return body


def _fmt(schema: dict[str, Any], strict: bool = False) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema,
                                                   "strict": strict}}


def _post_raw(url: str, data: bytes) -> tuple[int, Any]:
    """POST raw bytes; a dropped connection fails the test (it is what the issue saw)."""
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _metric(url: str, name: str) -> float:
    text = http_get(url + "/metrics")[1].decode()
    found = re.search(rf"^{name} ([0-9.e+]+)$", text, re.MULTILINE)
    assert found, name
    return float(found.group(1))


def test_engine_killing_schema_is_a_400_every_time(url: str) -> None:
    """The issue's schema, strict or not, streamed or not, three times each: a 400 naming the
    ``$ref``, refused from memory after the first time; the engine stays up and serves."""
    refused = _metric(url, "grammarserve_server_grammar_refused_total")
    for strict in (False, True):
        for stream in (False, True):
            for _ in range(3):
                status, reply = http_post(url + "/v1/chat/completions", _chat(
                    response_format=_fmt(OOM_SCHEMA, strict), stream=stream))
                assert status == 400, reply
                err = reply["error"]
                assert err["param"] == "response_format"
                assert err["message"] == (
                    "Invalid schema for response_format 'out': the schema has no finite "
                    f"instance: the $ref at {REF_PATH} can never be completed (it recurses "
                    "with no base case, so every value must contain another one); make the "
                    "recursive property optional, or allow an empty array or null")
    assert _metric(url, "grammarserve_server_grammar_refused_total") >= refused + 10
    assert http_get(url + "/health")[0] == 200
    # NOTE: room for the model's own whitespace (the flexible style: '{\n  "ok": true\n}')
    status, reply = http_post(url + "/v1/chat/completions", _chat(response_format=_fmt(
        {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}),
        max_tokens=48))
    assert status == 200 and reply["choices"][0]["finish_reason"] == "stop", reply
    assert json.loads(reply["choices"][0]["message"]["content"])["ok"] in (True, False)


def test_optional_part_that_never_ends_is_a_400(url: str) -> None:
    schema = {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}},
              "$defs": {"a": NODE}}
    status, reply = http_post(url + "/v1/chat/completions", _chat(response_format=_fmt(schema)))
    assert status == 400 and "has a part with no finite instance" in reply["error"]["message"]


BAD_CONSTRAINTS: list[tuple[str, dict[str, Any], str, str]] = [
    ("grammar without end", {"grammar": 'start: "a" start\n'}, "grammar",
     "matches no finite text: rule 'start'"),
    ("grammar part without end", {"grammar": 'start: "x" | "a" loop\nloop: "b" loop\n'},
     "grammar", "rule 'loop' can never be completed"),
    ("empty regex", {"regex": "[^\\x00-\\U0010FFFF]"}, "regex", "allows no token at its start"),
    ("no instance", {"response_format": _fmt({"type": "array", "minItems": 3,
                                              "maxItems": 1})}, "response_format",
     "at $.minItems: minItems (3) is greater than maxItems (1)"),
    ("contradictory types", {"response_format": _fmt({"type": "string",
                                                      "allOf": [{"type": "integer"}]})},
     "response_format", "'type' allows string; allOf[0] allows integer"),
    ("regex the vocabulary cannot write", {"regex": "\U00092361"}, "regex",
     "cannot be completed"),
    ("lark terminal regex", {"grammar": "start: /[/\n"}, "grammar",
     "invalid Lark grammar: unterminated character set"),
    ("huge repeat", {"regex": "a{4294967296}"}, "regex", "repetition number is too large"),
]


@pytest.mark.parametrize("name, patch, param, words", BAD_CONSTRAINTS,
                         ids=[c[0] for c in BAD_CONSTRAINTS])
def test_bad_constraint_is_the_same_400_streamed_or_not(url: str, name: str,
                                                        patch: dict[str, Any], param: str,
                                                        words: str) -> None:
    replies = []
    for stream in (False, True):
        for route, body in (("/v1/chat/completions", _chat(**patch, stream=stream)),
                            ("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 8,
                                                 "stream": stream, **patch})):
            if route == "/v1/completions" and "response_format" in patch:
                continue
            status, reply = http_post(url + route, body)
            assert status == 400, (route, stream, reply)
            replies.append(reply["error"])
    assert all(e == replies[0] for e in replies), replies
    assert replies[0]["param"] == param and words in replies[0]["message"], replies[0]
    # NOTE: what only the engine's compile refuses (the server runs the front end alone)
    # leaves nothing in flight behind its 400
    assert _metric(url, "grammarserve_requests_in_flight") == 0


@pytest.mark.parametrize("params, shown", [({"type": "string"}, "string"),
                                           ({"properties": {"a": {"type": "string"}}}, "None")])
def test_tool_parameters_must_be_an_object_schema(url: str, params: dict[str, Any],
                                                  shown: str) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": params}}]
    for choice in ("auto", "required"):
        status, reply = http_post(url + "/v1/chat/completions", _chat(tools=tools,
                                                                      tool_choice=choice))
        assert status == 400, reply
        assert reply["error"]["param"] == "tools[0].function.parameters"
        assert reply["error"]["message"] == (
            "Invalid schema for function 'f': schema must be a JSON Schema of 'type: "
            f"\"object\"', got 'type: \"{shown}\"'.")


@pytest.mark.parametrize("depth", DEPTHS)
def test_request_json_nested_at_any_depth_is_a_400(url: str, depth: int) -> None:
    """Deep JSON anywhere in a body (an unknown field, message content, a schema, tool
    parameters), on every generating route and /tokenize: a 400 naming the limit."""
    deep = "[" * depth + "1" + "]" * depth
    schema = '{"type": "array", "items": ' * depth + '{"type": "string"}' + "}" * depth
    chat = json.dumps(_chat())[:-1]
    bodies = {
        "/v1/chat/completions": [
            chat + f', "extra": {deep}}}',
            chat.replace('"Give me JSON."', f'[{{"type": "text", "text": "x", "d": {deep}}}]')
            + "}",
            chat + f', "response_format": {{"type": "json_schema", "json_schema": '
                   f'{{"name": "o", "schema": {schema}}}}}}}',
            chat + ', "tool_choice": "required", "tools": [{"type": "function", "function": '
                   f'{{"name": "f", "parameters": {{"type": "object", "properties": '
                   f'{{"x": {schema}}}}}}}}}]}}'],
        "/v1/completions": [f'{{"model": "m", "prompt": "x", "regex": "a", "d": {deep}}}'],
        "/v1/responses": [f'{{"model": "m", "input": "x", "d": {deep}}}'],
        "/tokenize": [f'{{"prompt": "x", "d": {deep}}}'],
    }
    for route, datas in bodies.items():
        for data in datas:
            if depth < 900:
                json.loads(data)  # the test's own bodies are JSON
            status, reply = _post_raw(url + route, data.encode())
            assert status == 400, (route, reply)
            assert re.fullmatch(r"the request body is nested \d+ levels deep; this server "
                                r"accepts JSON nested at most 128 levels \(--max-json-depth\)",
                                reply["error"]["message"]), reply
    assert http_get(url + "/health")[0] == 200


@pytest.mark.parametrize("depth", DEPTHS)
def test_regex_and_grammar_nested_at_any_depth_are_a_400(url: str, depth: int) -> None:
    regex = "(?:" * depth + "a" + ")" * depth
    grammar = "start: " + "(" * depth + '"a"' + ")" * depth + "\n"
    for param, value in (("regex", regex), ("grammar", grammar)):
        for stream in (False, True):
            status, reply = http_post(url + "/v1/completions", {
                "model": "m", "prompt": "x", "max_tokens": 2, "stream": stream, param: value})
            assert status == 400, reply
            assert reply["error"]["param"] == param
            assert f"nested {depth} levels deep" in reply["error"]["message"]
            assert "at most 64 levels" in reply["error"]["message"]


def test_schema_nesting_under_the_request_limit(url: str) -> None:
    """A schema deeper than the schema limit but inside the request limit gets the schema's
    400 (naming its path and the limit); one at the limit is served."""
    def nested(levels: int) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "string", "maxLength": 4}
        for _ in range(levels):
            schema = {"type": "array", "items": schema, "maxItems": 1}
        return schema

    status, reply = http_post(url + "/v1/chat/completions", _chat(response_format=_fmt(
        nested(100))))
    assert status == 400 and reply["error"]["param"] == "response_format"
    assert "is nested more than 64 levels deep (at $.items" in reply["error"]["message"]
    status, reply = http_post(url + "/v1/chat/completions", _chat(
        response_format=_fmt(nested(63)), max_tokens=4))
    assert status == 200, reply
