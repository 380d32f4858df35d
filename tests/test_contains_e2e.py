"""End to end through the real server (issue 33, item 3): ``contains`` schemas as a
chat-completions ``response_format`` at temperature 0, 0.7 and 1. An array that closes
without a matching item is rolled back to its closing bracket and generation goes on; the
reply validates (``stop``), is cut by ``max_tokens`` (``length``), or is a clean 400 after the
bounded retries, never a 500 (once every request in the step failed with "a batch entry must
bring at least one new token")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from server_helpers import ROOT, http_post

pytestmark = pytest.mark.model

CONTAINS = {"type": "array", "items": {"type": "string"}, "contains": {"const": "lang:en"}}
UNIQUE_TAGS = json.loads(Path(ROOT, "schemas", "hard_unique_tags.json").read_text())["schema"]
CASES = [(name, schema, temperature) for name, schema in
         (("contains", CONTAINS), ("hard_unique_tags", UNIQUE_TAGS))
         for temperature in (0, 0.7, 1)]


@pytest.mark.parametrize(("name", "schema", "temperature"), CASES,
                         ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_contains_schemas_give_valid_replies_or_clean_errors(
        e2e_server: dict[str, Any], name: str, schema: dict[str, Any],
        temperature: float) -> None:
    body = {"model": "default", "max_tokens": 60, "temperature": temperature, "seed": 7,
            "messages": [{"role": "user", "content": "Give tags as JSON."}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": name, "schema": schema}}}
    status, reply = http_post(e2e_server["url"] + "/v1/chat/completions", body)
    if status == 400:  # the value checks ran out of retries: the request's own clean error
        error = reply["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == "response_format"
        assert "value check failed" in error["message"], error
        return
    assert status == 200, reply
    choice = reply["choices"][0]
    assert choice["finish_reason"] in ("stop", "length"), choice
    if choice["finish_reason"] == "stop":
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
