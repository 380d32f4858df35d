"""``if``/``then``/``else`` and ``dependentRequired``/``dependencies`` rewritten exactly
(``fsm/schema/rewrite/conditions.py``), or refused with their path."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from rewrite_helpers import assert_equivalent, rewritten

from grammarserve.errors import UnsupportedSchemaError
from grammarserve.fsm.schema.rewrite.conditions import MAX_CASES, dependency_cases

ADDRESS = {"type": "object", "properties": {"country": {"enum": ["US", "CA"]},
                                            "zip": {"type": "string"}},
           "required": ["country", "zip"],
           "if": {"properties": {"country": {"const": "US"}}},
           "then": {"properties": {"zip": {"pattern": "^[0-9]{5}$"}}},
           "else": {"properties": {"zip": {"pattern": "^[A-Z][0-9][A-Z] [0-9][A-Z][0-9]$"}}}}


@pytest.mark.parametrize("schema", [
    {"if": {"type": "string"}, "then": {"minLength": 2}},
    {"if": {"type": "string"}, "then": {"minLength": 2}, "else": {"type": "null"}},
    {"if": {"type": "string"}, "else": {"type": "null"}},
    {"if": {"minimum": 2}, "then": {"maximum": 2.5}, "else": {"type": "integer"}},
    {"if": {"required": ["a"]}, "then": {"required": ["b"]}},
    {"type": "object", "if": {"properties": {"kind": {"const": "cat"}}, "required": ["kind"]},
     "then": {"required": ["a"]}, "else": {"properties": {"a": False}}},
    {"if": True, "then": {"type": "string"}, "else": {"type": "null"}},
    {"if": False, "then": {"type": "string"}, "else": {"type": "null"}},
    {"if": {"type": "string"}},
    {"then": {"type": "string"}},
    {"else": {"type": "string"}},
    {"anyOf": [{"type": "null"}, {"if": {"type": "array"}, "then": {"maxItems": 1}}]},
    {"type": "object", "dependentRequired": {"a": ["b"]}},
    {"dependentRequired": {"a": ["b", "c"], "b": ["c"]}},
    {"dependentRequired": {"a": ["b"], "b": ["a"]}},
    {"dependentRequired": {"a": []}},
    {"type": "object", "properties": {"a": {}, "b": {}}, "additionalProperties": False,
     "dependentRequired": {"a": ["b"]}},
])
def test_condition_is_rewritten_exactly(schema: dict[str, Any]) -> None:
    assert_equivalent(schema, extra=[{"kind": "cat", "a": 1}, {"kind": "dog"}])


def test_address_cases() -> None:
    out = assert_equivalent(ADDRESS, extra=[
        {"country": "US", "zip": "12345"}, {"country": "US", "zip": "K1A 0B1"},
        {"country": "CA", "zip": "K1A 0B1"}, {"country": "CA", "zip": "12345"}])
    assert len(out["anyOf"]) == 2


def test_then_without_negation_when_then_is_missing() -> None:
    out = rewritten({"if": {"type": "string"}, "else": {"type": "null"}})
    assert out == {"anyOf": [{"type": "string"}, {"type": "null"}]}


def test_if_without_exact_negation_is_refused_with_path() -> None:
    with pytest.raises(UnsupportedSchemaError) as info:
        rewritten({"properties": {"a": {"if": {"pattern": "b+"}, "then": {"minLength": 2}}}})
    assert info.value.path == "$.properties.a.if" and "'if'" in str(info.value)


def test_dependencies_array_form_is_dependent_required() -> None:
    out = rewritten({"type": "object", "dependencies": {"a": ["b"]}})
    check = jsonschema.Draft202012Validator(out)
    assert check.is_valid({"a": 1, "b": 2}) and check.is_valid({"b": 2})
    assert not check.is_valid({"a": 1})
    assert "dependencies" not in out


def test_dependency_cases_are_disjoint_and_capped() -> None:
    cases = dependency_cases({"a": ["b"], "c": ["d"]})
    assert len(cases) == 4
    for i, a in enumerate(cases):
        for b in cases[i + 1:]:
            both = jsonschema.Draft202012Validator({"allOf": [a, b]})
            assert not any(both.is_valid(o) for o in (
                {}, {"a": 1, "b": 1}, {"c": 1, "d": 1}, {"a": 1, "b": 1, "c": 1, "d": 1}))
    many = {f"k{i}": [f"d{i}"] for i in range(7)}
    assert 2 ** 7 > MAX_CASES
    with pytest.raises(UnsupportedSchemaError) as info:
        rewritten({"type": "object", "dependentRequired": many})
    assert info.value.path == "$.dependentRequired" and str(MAX_CASES) in str(info.value)


SWITCH_POOL = [{"f": "a", "x": 1}, {"f": "a", "x": "s"}, {"f": "b", "y": 1}, {"f": "b", "y": "s"},
               {"f": "c"}, {"f": "c", "z": 1}, {}, {"x": 1, "y": 1}, {"x": "s"}, {"z": "s"},
               {"f": 1}, "s", 3, None]


@pytest.mark.parametrize("required", [[], ["f"]])
@pytest.mark.parametrize("node", [{}, {"type": "object"}, {"required": ["f"]}])
def test_switch_on_one_key_is_one_any_of(required: list[str], node: dict[str, Any]) -> None:
    schema = {**node, "allOf": [
        {"if": {"properties": {"f": {"const": "a"}}, "required": required},
         "then": {"properties": {"x": {"type": "integer"}}}},
        {"if": {"properties": {"f": {"const": "b"}}, "required": required},
         "then": {"properties": {"y": {"type": "integer"}}}, "else": {"properties": {
             "z": {"type": "string"}}}},
        {"minProperties": 0}]}
    out = assert_equivalent(schema, extra=SWITCH_POOL)
    assert "if" not in str(out) and len(out["allOf"]) == 2
