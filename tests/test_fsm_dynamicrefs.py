"""Draft 2020-12 dynamic references resolved statically (``fsm/schema/read/dynamicrefs.py``) and the
2020-12 meta-schemas' ``$dynamicRef: "#meta"`` (``fsm/schema/read/metaschemas.py``), model-free: grammar schema plus value checks against
``jsonschema`` on pools of instances."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from check_helpers import passes, prepared

from grammarserve.errors import GrammarError, UnsupportedSchemaError
from grammarserve.fsm.schema.read import dynamicrefs
from grammarserve.fsm.schema.read.localrefs import localize_refs
from grammarserve.fsm.schema.tree import iter_subschemas

#: A tree whose nodes a strict extension closes: the tree's ``$dynamicRef: "#node"`` binds
#: to the outermost resource entered (the strict root), so children are strict too.
STRICT_TREE = {
    "$id": "https://example.com/strict-tree", "$dynamicAnchor": "node",
    "$ref": "tree", "unevaluatedProperties": False,
    "$defs": {"tree": {"$id": "tree", "$dynamicAnchor": "node", "type": "object",
                       "properties": {"data": True, "children": {
                           "type": "array", "items": {"$dynamicRef": "#node"}}}}}}

#: One generic list, two element types: the list is copied once per binding.
GENERIC_LIST = {
    "$id": "https://example.com/main",
    "anyOf": [{"$ref": "numbers"}, {"$ref": "strings"}],
    "$defs": {
        "list": {"$id": "list", "type": "array", "items": {"$dynamicRef": "#item"},
                 "$defs": {"any": {"$dynamicAnchor": "item"}}},
        "numbers": {"$id": "numbers", "$ref": "list",
                    "$defs": {"item": {"$dynamicAnchor": "item", "type": "number"}}},
        "strings": {"$id": "strings", "$ref": "list",
                    "$defs": {"item": {"$dynamicAnchor": "item", "type": "string"}}}}}

#: A resource entered by descent (``$id`` in ``properties``) binds as well.
DESCENT = {
    "$id": "https://example.com/d",
    "properties": {"inner": {"$id": "inner", "$dynamicAnchor": "v", "type": "string",
                             "$defs": {"x": {}}},
                   "use": {"$ref": "user"}},
    "$defs": {"user": {"$id": "user", "$dynamicRef": "#v",
                       "$defs": {"v": {"$dynamicAnchor": "v", "type": "integer"}}}}}

#: A reference whose pointer crosses a resource (``mid``) enters only the target's own one.
POINTER_THROUGH = {
    "$id": "https://example.com/r", "$ref": "#/$defs/mid/$defs/leaf",
    "$defs": {"mid": {"$id": "mid", "$defs": {
        "t": {"$dynamicAnchor": "t", "type": "string"},
        "leaf": {"$id": "leaf", "$dynamicRef": "#t",
                 "$defs": {"t": {"$dynamicAnchor": "t", "type": "integer"}}}}}}}

#: Recursion under a binding: nested lists of the bound leaf type.
NESTED = {
    "$id": "https://example.com/rec", "$ref": "ints",
    "$defs": {"nested": {"$id": "nested", "anyOf": [
        {"$dynamicRef": "#leaf"}, {"type": "array", "items": {"$ref": "nested"}}],
        "$defs": {"leaf": {"$dynamicAnchor": "leaf", "not": True}}},
        "ints": {"$id": "ints", "$ref": "nested",
                 "$defs": {"leaf": {"$dynamicAnchor": "leaf", "type": "integer"}}}}}

POOL: list[Any] = [
    None, 0, 1, 2.5, "a", "", [], [1], [1, 2], ["a"], ["a", 1], [[1]], {}, {"data": 1},
    {"data": 1, "x": 2}, {"children": []}, {"children": [{"data": 1}]},
    {"children": [{"daat": 1}]}, {"children": [{"children": [{"data": {}}]}]},
    {"children": [{"children": [{"oops": 1}]}]}, {"inner": "s"}, {"inner": 1},
    {"use": 1}, {"use": "s"}, {"inner": "s", "use": 3}, {"inner": "s", "use": "t"},
    [[1], [[2]]], [["s"]], [1, [2, [3]]],
]


@pytest.mark.parametrize("schema", [STRICT_TREE, GENERIC_LIST, DESCENT, POINTER_THROUGH,
                                    NESTED],
                         ids=["strict_tree", "generic_list", "descent", "pointer_through",
                              "nested"])
def test_dynamic_scopes_are_exact(schema: dict[str, Any]) -> None:
    out, checks = prepared(schema)
    assert "$dynamicRef" not in json.dumps(out) and "$dynamicAnchor" not in json.dumps(out)
    original = jsonschema.Draft202012Validator(schema)
    for doc in POOL:
        assert passes(doc, out, checks) == original.is_valid(doc), (doc, out)


def test_each_binding_gets_one_copy() -> None:
    out = localize_refs(json.loads(json.dumps(GENERIC_LIST)))
    copies = {k: v for k, v in out["$defs"].items() if k.startswith("dyn_")}
    items = sorted(v["items"]["$ref"] for v in copies.values() if "items" in v)
    assert items == ["#/$defs/numbers/$defs/item", "#/$defs/strings/$defs/item"]
    # the original list, reached by nothing now, keeps a plain reference (not a dynamic one)
    assert out["$defs"]["list"]["items"] == {"$ref": "#/$defs/list/$defs/any"}


def test_recursion_through_the_root_binding_is_the_root() -> None:
    out = localize_refs(json.loads(json.dumps(STRICT_TREE)))
    copies = [v for k, v in out["$defs"].items() if k.startswith("dyn_")]
    assert [c["properties"]["children"]["items"] for c in copies] == [{"$ref": "#"}]


def test_too_many_copies_leave_the_dynamic_ref_to_be_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dynamicrefs, "MAX_COPIES", 1)
    with pytest.raises(UnsupportedSchemaError, match="dynamic"):
        prepared(GENERIC_LIST)


def test_dynamic_ref_to_a_remote_place_is_refused() -> None:
    schema = {"$defs": {"a": {"$id": "a", "$dynamicAnchor": "t"},
                        "b": {"$id": "b", "$dynamicAnchor": "t"}},
              "items": {"$dynamicRef": "http://localhost:1234/x.json#t"}}
    with pytest.raises(GrammarError):
        prepared(schema)


META = "https://json-schema.org/draft/2020-12/schema"
SCHEMAS_AS_DATA: list[Any] = [
    True, False, 1, "x", {}, {"type": "integer"}, {"type": 1}, {"type": ["string", "null"]},
    {"type": ["string", "string"]}, {"minLength": 1}, {"minLength": -1}, {"required": ["a"]},
    {"required": ["a", "a"]}, {"properties": {"a": {"type": "strin"}}},
    {"properties": {"a": {"items": {"maxItems": 2}}}}, {"$defs": {"x": {"type": "integer"}}},
    {"$defs": {"x": {"type": 1}}}, {"allOf": []}, {"allOf": [{"not": {"enum": [1]}}]},
    {"dependencies": {"a": ["b"]}}, {"dependencies": {"a": {"minimum": "1"}}},
]


@pytest.mark.parametrize("schema", [
    {"$ref": META},
    {"properties": {"s": {"$ref": META}}, "required": ["s"]},
    {"$ref": "https://json-schema.org/draft/2020-12/meta/applicator#/$defs/schemaArray"},
], ids=["root", "property", "vocabulary"])
def test_the_2020_12_meta_schema_is_bundled_exactly(schema: dict[str, Any]) -> None:
    out, checks = prepared(schema)
    assert not [p for sub, p in iter_subschemas(out) if "$dynamicRef" in sub]
    original = jsonschema.Draft202012Validator(schema)
    for data in SCHEMAS_AS_DATA + [[d] for d in SCHEMAS_AS_DATA] + [
            {"s": d} for d in SCHEMAS_AS_DATA]:
        assert passes(data, out, checks) == original.is_valid(data), data


def test_a_schema_binding_meta_itself_is_refused() -> None:
    schema = {"$id": "https://example.com/custom", "$dynamicAnchor": "meta",
              "$ref": META, "properties": {"x-extra": {"type": "integer"}}}
    with pytest.raises(UnsupportedSchemaError, match="dynamic"):
        prepared(schema)


def test_the_suite_optional_pointer_across_a_resource_boundary() -> None:
    suite = Path(__file__).resolve().parent / "data" / "json-schema-test-suite"
    groups = json.loads((suite / "draft2020-12" / "optional" / "dynamicRef.json").read_text())
    for group in groups:
        out, checks = prepared(group["schema"])
        for test in group["tests"]:
            assert passes(test["data"], out, checks) is test["valid"], test["description"]


def test_a_resource_entered_by_descent_is_in_the_dynamic_scope() -> None:
    """The root resource binds ``t`` first (the specification: the dynamic scope starts at
    the root). NOTE: Python ``jsonschema`` records a resource only when a reference is
    followed from it, so it would bind ``y``'s own anchor here."""
    schema = {"$id": "https://example.com/r", "$dynamicAnchor": "t",
              "type": ["object", "integer"],
              "properties": {"x": {"$id": "x", "properties": {"y": {
                  "$id": "y", "$dynamicRef": "#t",
                  "$defs": {"t": {"$dynamicAnchor": "t", "type": "string"}}}}}}}
    out, checks = prepared(schema)
    assert out["properties"]["x"]["properties"]["y"]["$ref"] == "#"
    for doc, valid in [({"x": {"y": 1}}, True), ({"x": {"y": {}}}, True),
                       ({"x": {"y": "s"}}, False)]:
        assert passes(doc, out, checks) is valid, doc
