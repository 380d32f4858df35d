"""vLLM's ``structured_outputs`` extra body: each kind becomes our constraint, bad shapes are
400s naming the field; end to end with the official ``openai`` SDK on the real server."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import openai
import pytest
from openai_helpers import chat_req

from grammarserve.errors import InvalidRequestError
from grammarserve.openai.translate import check_common, constraint_plan

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                          "population": {"type": "integer", "minimum": 0}},
          "required": ["city", "population"], "additionalProperties": False}


@pytest.mark.parametrize("value, kind, param", [
    ({"json": SCHEMA}, "json_schema", "structured_outputs.json"),
    ({"json": json.dumps(SCHEMA)}, "json_schema", "structured_outputs.json"),
    ({"json_object": True}, "json_schema", "structured_outputs.json_object"),
    ({"regex": "[a-z]+"}, "regex", "structured_outputs.regex"),
    ({"choice": ["yes", "no"]}, "choice", "structured_outputs.choice"),
    ({"grammar": 'root ::= "a" | "b"'}, "grammar", "structured_outputs.grammar"),
    ({"grammar": 'start: "a" | "b"'}, "grammar", "structured_outputs.grammar"),
    ({"json": SCHEMA, "disable_additional_properties": True, "disable_fallback": True,
      "disable_any_whitespace": False}, "json_schema", "structured_outputs.json"),
])
def test_each_kind_becomes_our_constraint(value: dict[str, Any], kind: str, param: str) -> None:
    req = chat_req(structured_outputs=value)
    check_common(req, max_n=4)
    plan = constraint_plan(req, None)
    assert plan is not None and plan.param == param and plan.constraint.kind == kind
    if "grammar" in value:
        assert plan.constraint.syntax == ("ebnf" if "::=" in value["grammar"] else "lark")
    if "json" in value:
        assert plan.constraint.spec == SCHEMA


@pytest.mark.parametrize("value, param, words", [
    ({"json": SCHEMA, "regex": "a"}, "structured_outputs.regex", "takes one constraint"),
    ({"jsn": SCHEMA}, "structured_outputs.jsn", "not a structured_outputs field"),
    ({"json": "{not json"}, "structured_outputs.json", "not valid JSON"),
    ({"choice": []}, "structured_outputs.choice", "non-empty list of strings"),
    ({"regex": ""}, "structured_outputs.regex", "non-empty string"),
    ({"json": SCHEMA, "whitespace_pattern": "[ ]?"}, "structured_outputs.whitespace_pattern",
     "not supported"),
    ({"json": SCHEMA, "disable_any_whitespace": True},
     "structured_outputs.disable_any_whitespace", "not supported"),
    ("regex", "structured_outputs", "must be an object"),
])
def test_bad_shapes_are_400s_naming_the_field(value: Any, param: str, words: str) -> None:
    with pytest.raises(InvalidRequestError, match=words) as e:
        constraint_plan(chat_req(structured_outputs=value), None)
    assert e.value.param == param


def test_it_is_one_constraint_among_the_others() -> None:
    with pytest.raises(InvalidRequestError, match="only one") as e:
        constraint_plan(chat_req(structured_outputs={"regex": "a"}, regex="b"), None)
    assert e.value.param == "structured_outputs.regex"


@pytest.fixture(scope="module")
def client(e2e_server: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=e2e_server["url"] + "/v1", api_key="none", max_retries=0,
                         timeout=300)


def _ask(client: openai.OpenAI, question: str, so: dict[str, Any]) -> Any:
    return client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": question}], max_tokens=64,
        temperature=0, extra_body={"structured_outputs": so}).choices[0]


@pytest.mark.model
def test_json_schema_through_the_sdk(client: openai.OpenAI) -> None:
    choice = _ask(client, "Name a large city and its population as JSON.", {"json": SCHEMA})
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)


@pytest.mark.model
def test_choice_regex_and_gbnf_through_the_sdk(client: openai.OpenAI) -> None:
    got = _ask(client, "Is the sky blue? Answer yes or no.", {"choice": ["yes", "no"]})
    assert got.message.content in ("yes", "no") and got.finish_reason == "stop"
    got = _ask(client, "Write a date.", {"regex": r"\d{4}-\d{2}-\d{2}"})
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", got.message.content)
    got = _ask(client, "Pick a colour.", {"grammar": 'root ::= "red" | "green" | "blue"'})
    assert got.message.content in ("red", "green", "blue") and got.finish_reason == "stop"


@pytest.mark.model
def test_a_bad_field_is_a_400_over_http(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        _ask(client, "hi", {"json": SCHEMA, "whitespace_pattern": " "})
    assert e.value.body["param"] == "structured_outputs.whitespace_pattern"  # type: ignore[index]
