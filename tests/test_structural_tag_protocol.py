"""``structural_tag`` in the protocol layer, without a model: ``response_format`` of type
``structural_tag`` (vLLM's and SGLang's legacy and ``format`` shapes) and vLLM's older top-level
``structural_tag`` field become one ``structural_tag`` constraint, passed on as sent; the grammar
layer's refusals become 400s whose param and message name the path inside the tag."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai_helpers import chat_req

from grammarserve.errors import GrammarError, InvalidRequestError
from grammarserve.fsm.config import GrammarConfig
from grammarserve.fsm.frontend import SpecBuilder
from grammarserve.openai.translate import check_common, constraint_plan, grammar_error

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "default": None}},
          "required": ["city"]}
LEGACY: dict[str, Any] = {"type": "structural_tag", "triggers": ["<function="], "structures": [
    {"begin": "<function=get_weather>", "schema": SCHEMA, "end": "</function>"}]}
FORMAT: dict[str, Any] = {"type": "structural_tag", "format": {
    "type": "triggered_tags", "triggers": ["<function="], "tags": [
        {"type": "tag", "begin": "<function=get_weather>", "end": "</function>",
         "content": {"type": "json_schema", "json_schema": SCHEMA}}]}}


def _refused(**body: Any) -> InvalidRequestError:
    """The 400 the server answers: the plan's constraint through the grammar front end."""
    plan = constraint_plan(chat_req(**body), None)
    assert plan is not None and plan.constraint.kind == "structural_tag"
    kind, args, kwargs = plan.constraint.compile_args()
    with pytest.raises(GrammarError) as e:
        SpecBuilder(GrammarConfig()).spec(kind, *args, **kwargs)
    return grammar_error(e.value, plan)


@pytest.mark.parametrize("rf", [LEGACY, FORMAT])
def test_response_format_structural_tag_is_passed_on_as_sent(rf: dict[str, Any]) -> None:
    plan = constraint_plan(chat_req(response_format=rf), None)
    assert plan is not None and plan.param == "response_format"
    assert plan.constraint.kind == "structural_tag"
    assert plan.constraint.spec == rf  # nulls inside the schema kept (no model dump)
    kind, args, _ = plan.constraint.compile_args()
    spec = SpecBuilder(GrammarConfig()).spec(kind, *args)
    assert spec.kind == "structural_tag"
    assert json.loads(spec.source)["format"]["type"] == "triggered_tags"


def test_top_level_structural_tag_field_replaces_the_old_refusal() -> None:
    req = chat_req(structural_tag=json.dumps(LEGACY))
    check_common(req, max_n=4)  # no longer a foreign field
    plan = constraint_plan(req, None)
    assert plan is not None and plan.param == "structural_tag"
    kind, args, _ = plan.constraint.compile_args()
    assert SpecBuilder(GrammarConfig()).spec(kind, *args).kind == "structural_tag"
    with pytest.raises(InvalidRequestError, match="only one") as e:
        constraint_plan(chat_req(structural_tag=LEGACY, regex="a"), None)
    assert e.value.param == "structural_tag"
    # vLLM's newer extra body carries it too
    req = chat_req(structured_outputs={"structural_tag": json.dumps(LEGACY)})
    check_common(req, max_n=4)
    plan = constraint_plan(req, None)
    assert plan is not None and plan.param == "structured_outputs.structural_tag"
    assert plan.constraint.kind == "structural_tag"


@pytest.mark.parametrize("rf, param, words", [
    # bad shape
    ({"type": "structural_tag", "structures": {"begin": "<f>"}, "triggers": ["<f"]},
     "response_format.structures", "response_format.structures: must be a non-empty list"),
    ({"type": "structural_tag", "format": {"type": "tag", "begin": "<a>", "content": {
        "type": "any_text"}}}, "response_format.format.end",
     "response_format.format.end: must be a non-empty list of strings"),
    # bad schema: the path inside the tag, then inside the schema
    ({**LEGACY, "structures": [{**LEGACY["structures"][0], "schema": {
        "type": "object", "properties": {"a": {"type": "strin"}}}}]},
     "response_format.structures[0].schema",
     "response_format.structures[0].schema: invalid JSON Schema at $.properties.a.type"),
    ({"type": "structural_tag", "format": {**FORMAT["format"], "tags": [{
        **FORMAT["format"]["tags"][0], "content": {"type": "json_schema", "json_schema": {
            "type": "integer", "minimum": "one"}}}]}},
     "response_format.format.tags[0].content.json_schema",
     "response_format.format.tags[0].content.json_schema: invalid JSON Schema at $.minimum"),
    # unknown and refused format types
    ({"type": "structural_tag", "format": {"type": "sequence", "elements": [
        {"type": "const_string", "value": "a"}, {"type": "jsonschema"}]}},
     "response_format.format.elements[1].type", "unknown format type 'jsonschema'"),
    ({"type": "structural_tag", "format": {"type": "any_tokens"}}, "response_format.format",
     "format type 'any_tokens' is not supported"),
    # a trigger that no begin starts with, a begin that starts with no trigger
    ({**LEGACY, "triggers": ["<function=", "<tool>"]}, "response_format.triggers[1]",
     "no tag's begin starts with the trigger '<tool>'"),
    ({**LEGACY, "triggers": ["<tool="]}, "response_format.structures[0].begin",
     "starts with none of the triggers"),
])
def test_refusals_are_400s_naming_the_path(rf: dict[str, Any], param: str, words: str) -> None:
    err = _refused(response_format=rf)
    assert err.param == param
    assert str(err).startswith("Invalid structural_tag: response_format")
    assert words in str(err), str(err)


def test_top_level_field_refusals_name_it() -> None:
    err = _refused(structural_tag='{"triggers": ["<f"], "structures": []}')
    assert err.param == "structural_tag.structures"
    assert "structural_tag.structures: must be a non-empty list" in str(err)
    err = _refused(structural_tag="{not json")
    assert err.param == "structural_tag" and "must be JSON" in str(err)
