"""``oneOf`` -> ``anyOf`` for provably disjoint branches (``fsm/schema/algebra/disjoint.py``), else the
``anyOf`` of exclusive cases when every branch has an exact negation
(``fsm/schema/rewrite/oneof.py``)."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest
from rewrite_helpers import POOL

from grammarserve.fsm.schema.algebra.disjoint import pairwise_disjoint, rewrite_oneof
from grammarserve.fsm.schema.normalize import normalize
from grammarserve.fsm.schema.rewrite.oneof import MAX_BRANCHES
from grammarserve.fsm.schema.tree import iter_subschemas

CAT = {"type": "object", "properties": {"kind": {"const": "cat"}}, "required": ["kind"]}
DOG = {"type": "object", "properties": {"kind": {"const": "dog"}}, "required": ["kind"]}


@pytest.mark.parametrize("branches", [
    [{"type": "string"}, {"type": "integer"}],
    [{"type": "integer"}, {"type": "number", "minimum": 0}, {"type": "null"}][::2],
    [{"const": 1}, {"const": 2}, {"enum": ["a", None]}],
    [{"enum": [1, 2]}, {"type": "string"}],
    [{"const": 1}, {"type": "integer", "minimum": 2}],
    [CAT, DOG],
    [{"$ref": "#/$defs/cat"}, {"$ref": "#/$defs/dog"}],
    [{"type": "object", "properties": {"pet": CAT}, "required": ["pet"]},
     {"type": "object", "properties": {"pet": DOG}, "required": ["pet"]}],
    [{"type": "object", "required": ["a"]},
     {"type": "object", "properties": {"b": {}}, "additionalProperties": False}],
    [{"type": "object", "required": ["a"]}, {"type": "object", "properties": {"a": False}}],
    [{"type": "number", "maximum": 0}, {"type": "number", "exclusiveMinimum": 0}],
    [{"type": "integer", "exclusiveMaximum": 5}, {"type": "integer", "minimum": 5},
     {"type": "string"}],
    [{"type": "string", "maxLength": 2}, {"type": "string", "minLength": 3}],
    [{"type": "array", "maxItems": 0}, {"type": "array", "minItems": 1}],
    [False, {"type": "string"}],
])
def test_disjoint_branches(branches: list[Any]) -> None:
    root = {"$defs": {"cat": CAT, "dog": DOG}}
    assert pairwise_disjoint(root, branches)
    schema = {"oneOf": branches, **root}
    out = rewrite_oneof({**schema, "oneOf": list(branches)})
    assert "anyOf" in out and "oneOf" not in out
    one, any_ = jsonschema.Draft202012Validator(schema), jsonschema.Draft202012Validator(out)
    for instance in POOL + [{"pet": {"kind": "cat"}}, {"a": 1, "b": 1}]:
        assert one.is_valid(instance) == any_.is_valid(instance), instance


@pytest.mark.parametrize("branches", [
    [{"type": "string"}, {"minLength": 2}],
    [{"type": "integer"}, {"type": "number"}],
    [{"type": "number", "maximum": 0}, {"type": "number", "minimum": 0}],
    [{"required": ["a"]}, {"required": ["b"]}],
    [{"type": "object", "required": ["a"]},
     {"type": "object", "properties": {"a": {}}, "additionalProperties": False}],
    [{"type": "object", "properties": {"kind": {"const": "cat"}}},
     {"type": "object", "properties": {"kind": {"const": "dog"}}}],
    [{"enum": [1, 2]}, {"enum": [2.0, 3]}],
    [{"type": "object", "required": ["a"]},
     {"type": "object", "additionalProperties": False, "patternProperties": {"^a": {}}}],
    [True, {"type": "string"}],
    [{"anyOf": [{"type": "string"}]}, {"type": "string"}],
])
def test_overlapping_or_unproven_branches_stay_one_of(branches: list[Any]) -> None:
    assert not pairwise_disjoint({}, branches)
    out = rewrite_oneof({"oneOf": branches})
    assert "oneOf" in out


@pytest.mark.parametrize("schema", [
    {"type": "string", "oneOf": [{"minLength": 2}, {"maxLength": 4}]},
    {"oneOf": [{"type": "number"}, {}]},
    {"type": "object", "oneOf": [{"required": ["a", "b"]}, {"required": ["a", "c"]}]},
    {"oneOf": [{"properties": {"a": True, "b": True}, "required": ["a"]},
               {"properties": {"c": True}, "required": ["c"]}]},
    {"type": "integer", "oneOf": [{"minimum": 2}, {"maximum": 3}, {"const": 10}]},
    {"oneOf": [{}, False]},
])
def test_overlapping_branches_become_exclusive_cases(schema: dict[str, Any]) -> None:
    out = normalize(copy.deepcopy(schema))
    assert not any("oneOf" in sub for sub, _ in iter_subschemas(out)), out
    one, any_ = jsonschema.Draft202012Validator(schema), jsonschema.Draft202012Validator(out)
    for instance in POOL + [{"a": 1, "b": 1, "c": 1}, {"a": 1, "c": 1}, 10, 4]:
        assert one.is_valid(instance) == any_.is_valid(instance), (instance, out)


@pytest.mark.parametrize("schema", [
    {"oneOf": [{"type": "integer"}, {"minimum": 2}]},  # not(integer) holds non-integers
    {"oneOf": [{"pattern": "a+"}, {"type": "string"}]},
    {"oneOf": [{"type": "string"}] * (MAX_BRANCHES + 1)},
])
def test_cases_without_exact_negation_stay_one_of(schema: dict[str, Any]) -> None:
    assert "oneOf" in normalize(copy.deepcopy(schema))
