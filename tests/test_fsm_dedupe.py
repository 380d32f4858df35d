"""Repeated ``allOf``/``anyOf`` members dropped (``schema/rewrite/dedupe.py``): the schema means the same (same
verdicts), only exact repeats go (never ``oneOf`` branches, nor lists a ``$ref`` points into),
and the front end hands the backends the smaller schema (devinit's ``items``)."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest

from grammarserve.fsm.config import GrammarConfig
from grammarserve.fsm.frontend import SpecBuilder
from grammarserve.fsm.schema.rewrite.dedupe import dedupe_members

RUN = {"type": "object", "properties": {"tool": {"enum": ["a", "b"]}}, "required": ["tool"]}


def _devinit() -> dict[str, Any]:
    return {"$defs": {"run": RUN},
            "type": "array",
            "items": {"allOf": [{"$ref": "#/$defs/run"}], "anyOf": [{"$ref": "#/$defs/run"}]}}


def test_single_member_union_repeating_an_allof_member_goes() -> None:
    out = dedupe_members(_devinit())
    assert out["items"] == {"allOf": [{"$ref": "#/$defs/run"}]}


def test_repeated_members_go_first_kept() -> None:
    schema = {"allOf": [{"minimum": 1}, {"maximum": 5}, {"minimum": 1}],
              "anyOf": [{"type": "integer"}, {"type": "null"}, {"type": "integer"}],
              "oneOf": [{"minimum": 0}]}
    out = dedupe_members(copy.deepcopy(schema))
    assert out["allOf"] == [{"minimum": 1}, {"maximum": 5}]
    assert out["anyOf"] == [{"type": "integer"}, {"type": "null"}]
    assert out["oneOf"] == [{"minimum": 0}]  # not an allOf member: kept


@pytest.mark.parametrize("schema", [
    {"oneOf": [{"type": "string"}, {"type": "string"}]},  # accepts nothing: must stay
    {"allOf": [{"const": 1}, {"const": True}]},  # equal in Python, different in JSON
    {"anyOf": [{"properties": {"a": {}, "b": {}}}, {"properties": {"b": {}, "a": {}}}]},
    {"allOf": [{"minimum": 1}, {"minimum": 1}], "$defs": {"x": {"$ref": "#/allOf/1"}}},
    {"anyOf": [{"type": "null"}]},
])
def test_left_as_it_is(schema: dict[str, Any]) -> None:
    assert dedupe_members(copy.deepcopy(schema)) == schema


@pytest.mark.parametrize("instance", [[], [{"tool": "a"}], [{"tool": "c"}], [{}], [1], "x"])
def test_same_verdicts(instance: Any) -> None:
    before, after = _devinit(), dedupe_members(_devinit())
    assert jsonschema.Draft202012Validator(before).is_valid(instance) is \
        jsonschema.Draft202012Validator(after).is_valid(instance)


def test_front_end_drops_the_repeat() -> None:
    spec = SpecBuilder(GrammarConfig()).json_spec(_devinit())
    items = json.loads(spec.source)["items"]
    assert "anyOf" not in items and len(items["allOf"]) == 1
