"""End to end on the real server (shared with tests/test_server_e2e.py): bad requests get the
400 envelope naming the parameter, fuzzed bodies never get a 5xx, and the other routes
(models, tokenize, detokenize)."""

from __future__ import annotations

import json
import re
from typing import Any

import openai
import pytest
from e2e_jobs import GREETING, WEATHER
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_helpers import http_get, http_post

pytestmark = pytest.mark.model


# -- server and client -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(e2e_server: dict[str, Any]) -> dict[str, Any]:
    return e2e_server


@pytest.fixture(scope="module")
def client(server: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=server["url"] + "/v1", api_key="unused", max_retries=0,
                         timeout=300)


# -- errors ----------------------------------------------------------------------------------------
def _fmt(schema: dict[str, Any], strict: bool = False) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema,
                                                   "strict": strict}}


BAD_REQUESTS: list[tuple[str, dict[str, Any], str | None, str]] = [
    ("unknown type", {"response_format": _fmt({"type": "object", "properties": {
        "a": {"type": "strin"}}})}, "response_format", r"\$\.properties\.a\.type"),
    ("strict violation", {"response_format": _fmt({"type": "object", "properties": {
        "a": {"type": "string"}}}, strict=True)}, "response_format",
     "Invalid schema for response_format 'out': .*additionalProperties"),
    ("unsupported keyword", {"response_format": _fmt({"type": "object", "properties": {
        "a": {"$ref": "https://example.com/a.json"}}})}, "response_format",
     r"remote \$ref .* at \$\.properties\.a"),
    ("not json schema", {"response_format": _fmt({"type": "object", "required": "a"})},
     "response_format", r"\$\.required"),
    ("bad regex", {"regex": "(ab"}, "regex", "invalid regex"),
    ("bad grammar", {"grammar": "start: foo"}, "grammar", "foo"),
    ("bad tool schema", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integr"}}}}}], "tool_choice": "required"},
     "tools[0].function.parameters", r"properties\.x\.type"),
    ("unknown tool", {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {
        "name": "nope"}}}, "tool_choice", "'nope'"),
    ("tool_choice without tools", {"tool_choice": "required"}, "tool_choice", "tools"),
    ("n too large", {"n": 50}, "n", "n must be"),
    ("n out of range", {"n": 0}, "n", "greater than or equal to 1"),
    ("bad type", {"temperature": "hot"}, "temperature", "valid number"),
    ("empty messages", {"messages": []}, "messages", "at least one"),
    ("unknown role", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role",
     "Input should be"),
    ("image content", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, "messages[0].content[0].type",
     "not supported"),
    ("context too long", {"max_tokens": 10**6}, "messages", "maximum context length"),
    ("top_logprobs", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "top_logprobs"),
    ("json mode without json", {"response_format": {"type": "json_object"}}, "messages", "json"),
    ("two constraints", {"regex": "a", "choice": ["a"]}, "choice", "only one"),
    ("foreign constraint field", {"guided_json": {"type": "object"}}, "guided_json",
     "not supported"),
    ("missing model", {"model": None}, "model", "valid string"),
]


@pytest.mark.parametrize("name, patch, param, message", BAD_REQUESTS,
                         ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_get_400_envelope(server: dict[str, Any], name: str, patch: dict[str, Any],
                                       param: str | None, message: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    body.update(patch)
    status, reply = http_post(server["url"] + "/v1/chat/completions", body)
    assert status == 400, reply
    err = reply["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert re.search(message, err["message"]), err["message"]
    # OpenAI's code for a prompt (plus max_tokens) over the context; no other case has a code
    assert err["code"] == ("context_length_exceeded" if name == "context too long" else None)


def test_sdk_raises_bad_request_and_server_keeps_serving(client: openai.OpenAI,
                                                         server: dict[str, Any]) -> None:
    with pytest.raises(openai.BadRequestError, match="strin"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                       response_format=_fmt({"type": "strin"}))  # type: ignore
    status, reply = http_post(server["url"] + "/v1/chat/completions", None, raw=b"{not json")
    assert status == 400 and reply["error"]["type"] == "invalid_request_error"
    status, reply = http_post(server["url"] + "/v1/completions", {"model": "m", "prompt": []})
    assert status == 400 and reply["error"]["param"] == "prompt"
    status, reply = http_post(server["url"] + "/v1/completions", {
        "model": "m", "prompt": "x", "grammar": 'start: ("a"', "max_tokens": 2})
    assert status == 400 and reply["error"]["param"] == "grammar"
    status, body = http_get(server["url"] + "/v1/nothing")
    assert status == 404 and "error" in json.loads(body)
    assert http_get(server["url"] + "/health")[0] == 200


# -- other routes ----------------------------------------------------------------------------------
def test_models_tokenize_detokenize(client: openai.OpenAI, server: dict[str, Any]) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["SmolLM2-135M-Instruct"]
    assert client.models.retrieve("SmolLM2-135M-Instruct").object == "model"
    status, out = http_post(server["url"] + "/tokenize", {"prompt": "Hello world"})
    assert status == 200 and out["count"] == len(out["tokens"]) == 2
    assert out["max_model_len"] == 8192
    status, chat = http_post(server["url"] + "/tokenize", {"messages": GREETING})
    assert status == 200 and chat["count"] > 50 and chat["tokens"][0] == 1  # <|im_start|>
    status, back = http_post(server["url"] + "/detokenize", {"tokens": out["tokens"]})
    assert status == 200 and back["prompt"] == "Hello world"
    status, err = http_post(server["url"] + "/tokenize", {"prompt": "x", "messages": GREETING})
    assert status == 400 and err["error"]["param"] == "prompt"


# -- fuzzing ---------------------------------------------------------------------------------------
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=6)
_ROUTES = {
    "/v1/chat/completions": ({"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                             ["model", "messages", "response_format", "tools", "tool_choice",
                              "n", "stream", "stream_options", "logprobs", "top_logprobs", "stop",
                              "seed", "temperature", "top_p", "regex", "grammar", "choice",
                              "cache_namespace", "parallel_tool_calls", "user", "logit_bias"]),
    "/v1/completions": ({"model": "m", "prompt": "hi"},
                        ["model", "prompt", "n", "echo", "logprobs", "stop", "seed", "suffix",
                         "best_of", "temperature", "regex", "choice", "grammar", "stream"]),
    "/tokenize": ({"prompt": "hi"}, ["prompt", "messages", "tools", "add_generation_prompt",
                                     "return_token_strs"]),
    "/detokenize": ({"tokens": [1, 2]}, ["tokens"]),
}


def fuzz_request(url: str, route: str, data: st.DataObject) -> None:
    """One fuzzed request: a valid body with up to three fields replaced by random JSON."""
    base, fields = _ROUTES[route]
    body = dict(base)
    for key in data.draw(st.lists(st.sampled_from([*fields, "extra_field"]), max_size=3)):
        body[key] = data.draw(_JSON)
    for key in ("max_tokens", "max_completion_tokens", "n"):
        body[key] = 1  # keep each generation short
    status, reply = http_post(url + route, body)
    assert status in (200, 400), (route, body, status, reply)
    if status == 400:
        assert set(reply["error"]) == {"message", "type", "param", "code"}
    elif isinstance(reply, str):  # a stream: an error inside it must not be a server error
        assert '"server_error"' not in reply, (route, body, reply)


def test_fuzzed_bodies_never_get_5xx(server: dict[str, Any]) -> None:
    run = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))(
        given(route=st.sampled_from(sorted(_ROUTES)), data=st.data())(fuzz_request))
    run(server["url"])
    assert http_get(server["url"] + "/health")[0] == 200


def test_constraint_the_vocabulary_cannot_complete_is_a_400(client: openai.OpenAI) -> None:
    """A regex that needs a character whose bytes have no token in SmolLM2's vocabulary (found
    by the schemathesis run) is the client's constraint at fault: 400, never 500."""
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="m", prompt="x", max_tokens=8,
                                  extra_body={"regex": "\U00092361"})
    assert "cannot be completed" in str(err.value)
    ok = client.completions.create(model="m", prompt="x", max_tokens=4,
                                   extra_body={"regex": "[0-9]+"})
    assert ok.choices[0].text.isdigit()
