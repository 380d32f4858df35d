"""``normalize.py``'s reference rewrites for the backends, model-free: references to
``false`` become ``false``, a ``$ref`` into a cycle beside other assertions becomes an
``allOf`` member; both exact (checked against ``jsonschema``)."""

from __future__ import annotations

from typing import Any

import jsonschema
from check_helpers import passes, prepared


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
