"""``schema/normalize.py``'s rewrites for the backends, model-free: references to ``false`` become
``false``, a ``$ref`` into a cycle beside other assertions becomes an ``allOf`` member,
``const``/``enum`` objects are offered in every key order; all exact (checked against
``jsonschema``)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from check_helpers import passes, prepared

from grammarserve.fsm.schema.normalize import MAX_KEY_ORDERS, normalize


def _same(schema: dict[str, Any], docs: list[Any]) -> None:
    out, checks = prepared(schema)
    original = jsonschema.Draft202012Validator(schema)
    for doc in docs:
        assert passes(doc, out, checks) == original.is_valid(doc), doc


def test_references_to_false_are_false() -> None:
    schema = {"$defs": {"never": False, "any": True},
              "properties": {"a": {"$ref": "#/$defs/never"}, "b": {"$ref": "#/$defs/any"}}}
    out, checks = prepared(schema)
    assert out["properties"]["a"] is False and checks == []
    _same(schema, [{}, {"a": 1}, {"b": 1}, {"a": None, "b": 1}, 3])


#: The root extends a node type whose children refer back to the root.
CYCLE = {"type": "object", "properties": {"id": {"type": "integer"}},
         "$ref": "#/$defs/node",
         "$defs": {"node": {"type": "object", "properties": {
             "kids": {"type": "array", "items": {"$ref": "#"}}}}}}


def test_a_ref_into_a_cycle_beside_siblings_becomes_all_of() -> None:
    out, _ = prepared(CYCLE)
    assert "$ref" not in out and out["allOf"] == [
        {"type": "object", "properties": {"kids": {"type": "array",
                                                   "items": {"$ref": "#"}}}}]
    _same(CYCLE, [{}, {"id": 1}, {"id": "x"}, {"kids": []}, {"kids": [{"id": 2}]},
                  {"kids": [{"id": "y"}]}, {"kids": [{"kids": [{"id": None}]}]}, [], 1])


def test_other_refs_stay() -> None:
    acyclic = {"properties": {"a": {"type": "integer"}}, "$ref": "#/$defs/b",
               "$defs": {"b": {"required": ["a"]}}}
    assert prepared(acyclic)[0]["$ref"] == "#/$defs/b"
    alone = {"$defs": {"n": {"items": {"$ref": "#/$defs/n"}}}, "items": {"$ref": "#/$defs/n"}}
    assert prepared(alone)[0]["items"] == {"$ref": "#/$defs/n"}


#: dart_test's shape: an ``allOf`` member that is only a reference into a cycle, beside
#: another member.
CYCLE_MEMBER = {"$ref": "#/$defs/config",
                "$defs": {"config": {"type": "object", "properties": {
                    "name": {"type": "string"},
                    "presets": {"type": "object", "additionalProperties": {
                        "$ref": "#/$defs/config"}}}},
                          "runner": {"allOf": [{"$ref": "#/$defs/config"},
                                               {"properties": {"n": {"type": "integer"}}}]}}}


def test_an_all_of_member_into_a_cycle_becomes_its_copy() -> None:
    schema = {**CYCLE_MEMBER, "$ref": "#/$defs/runner"}
    out, _ = prepared(schema)
    first = out["$defs"]["runner"]["allOf"][0]
    assert "$ref" not in first and first["properties"]["name"] == {"type": "string"}
    _same(schema, [{}, {"name": "a"}, {"name": 1}, {"n": 1}, {"n": "x"},
                   {"presets": {"p": {"name": "b"}}}, {"presets": {"p": {"name": 2}}},
                   {"presets": {"p": {"n": "x"}}}, 3])


def test_constant_objects_in_every_key_order() -> None:
    out = normalize({"const": {"a": 1, "b": {"c": [1, {"d": 2, "e": 3}]}}})
    assert "const" not in out and len(out["enum"]) == 4
    assert out["enum"][0] == {"a": 1, "b": {"c": [1, {"d": 2, "e": 3}]}}
    texts = {json.dumps(v) for v in out["enum"]}
    assert '{"b": {"c": [1, {"e": 3, "d": 2}]}, "a": 1}' in texts and len(texts) == 4
    out = normalize({"enum": [1, {"x": 1, "y": 2}, [{"p": 1, "q": 2}]]})
    assert [json.dumps(v) for v in out["enum"]] == [
        "1", '{"x": 1, "y": 2}', '{"y": 2, "x": 1}', '[{"p": 1, "q": 2}]', '[{"q": 2, "p": 1}]']
    _same({"const": {"a": 1, "b": 2}}, [{"a": 1, "b": 2}, {"b": 2, "a": 1}, {"a": 1}, 1])


def test_too_many_key_orders_stay_as_written() -> None:
    wide = {k: 1 for k in "abcde"}  # 120 orders
    assert MAX_KEY_ORDERS < 120
    assert normalize({"const": wide}) == {"const": wide}
    both = {"const": {"a": 1, "b": 2}, "enum": [{"a": 1, "b": 2}, 3]}
    assert normalize(json.loads(json.dumps(both)))["const"] == {"a": 1, "b": 2}
