"""End to end through the real server (issue 16, item 2): schemas with keywords no grammar
holds (``uniqueItems`` on strings, a ``not`` without an exact rewrite) are served, not refused;
the model's repeats and excluded values are rolled back and retried, the replies validate,
streaming shows only what stays, and ``/metrics`` counts the retries."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
from server_helpers import http_get, http_post

pytestmark = pytest.mark.model

UNIQUE = {"type": "object", "properties": {"colors": {
    "type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 3,
    "maxItems": 5}}, "required": ["colors"], "additionalProperties": False}
NOT = {"type": "object", "properties": {
    "name": {"type": "string"},
    "age": {"type": "integer", "minimum": 1, "maximum": 99, "not": {"multipleOf": 5}}},
    "required": ["name", "age"], "additionalProperties": False}
CASES = [
    (UNIQUE, 'Give three colors as JSON: {"colors": ["red", "red", "red"]}'),
    (NOT, "Describe a 30-year-old man named John as JSON with his name and age."),
]


def _body(schema: dict[str, Any], prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 120, "temperature": 0, **extra,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "s", "schema": schema}}}


def _retries(url: str) -> float:
    text = http_get(url + "/metrics")[1].decode()
    m = re.search(r"^grammarserve_check_retries_total ([0-9.e+-]+)$", text, re.MULTILINE)
    assert m, "grammarserve_check_retries_total is not exported"
    return float(m.group(1))


def _stream(url: str, body: dict[str, Any]) -> tuple[str, str | None]:
    """The streamed content and finish reason of a chat completion (SSE over raw HTTP)."""
    import http.client
    from urllib.parse import urlparse

    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    conn.request("POST", "/v1/chat/completions", json.dumps({**body, "stream": True}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    text, finish = "", None
    for raw in resp.read().decode().splitlines():
        if not raw.startswith("data: ") or raw == "data: [DONE]":
            continue
        event = json.loads(raw[len("data: "):])
        for choice in event.get("choices", []):
            text += choice.get("delta", {}).get("content") or ""
            finish = choice.get("finish_reason") or finish
    conn.close()
    return text, finish


def test_checked_schemas_give_valid_replies_and_count_retries(e2e_server: dict[str, Any]
                                                              ) -> None:
    url = e2e_server["url"]
    before = _retries(url)
    for schema, prompt in CASES:
        status, reply = http_post(url + "/v1/chat/completions", _body(schema, prompt))
        assert status == 200, reply
        choice = reply["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
        streamed, finish = _stream(url, _body(schema, prompt))
        assert (streamed, finish) == (choice["message"]["content"], "stop")
    # NOTE: greedy SmolLM2 repeats "red" and writes a round age: both are rolled back
    assert _retries(url) - before >= 2 * 2


def test_keywords_that_cannot_be_checked_are_still_refused(e2e_server: dict[str, Any]
                                                           ) -> None:
    # a recursion through ``if``: no check can stand for the condition at every depth
    schema = {"$defs": {"t": {"type": "array", "uniqueItems": True, "items": {
        "if": {"$ref": "#/$defs/t"}, "then": {"minItems": 1}}}}, "$ref": "#/$defs/t"}
    status, reply = http_post(e2e_server["url"] + "/v1/chat/completions",
                              _body(schema, "Answer in JSON."))
    assert status == 400 and "'if'" in reply["error"]["message"]
