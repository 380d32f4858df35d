"""Older drafts translated into Draft 2020-12 (``fsm/schema/read/drafts.py``) and references made local
(``fsm/schema/read/localrefs.py``), model-free: what the front end makes of a schema accepts exactly what
``jsonschema`` accepts under the draft the schema declares."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from check_helpers import passes, prepared

from grammarserve.errors import SchemaValidationError, UnsupportedSchemaError
from grammarserve.fsm.schema.read.drafts import declared_draft, to_draft_2020
from grammarserve.fsm.schema.read.localrefs import hoist_ref_targets, localize_refs
from grammarserve.fsm.schema.tree import pointer, pointer_parts

D4 = "http://json-schema.org/draft-04/schema#"
D6 = "http://json-schema.org/draft-06/schema#"
D7 = "http://json-schema.org/draft-07/schema"
D2019 = "https://json-schema.org/draft/2019-09/schema"

POOL: list[Any] = [
    None, True, 0, 1, 4, 5, 5.5, 6, "", "a", "ab", "abc", [], [1], ["a"], [1, "a"],
    ["a", 1], [1, "a", 2], [1, "a", "b"], ["a", "a"], {}, {"a": 1}, {"a": "x"}, {"b": 1},
    {"a": 1, "b": 2}, {"a": 1, "b": "x"}, {"x": 1}, {"x": 1, "y": 2}, {"y": 2},
    {"x": "s", "y": 2}, {"n": {"n": {}}}, {"n": {"n": 1}}, {"n": 1}, {"z": [1, 1]},
]

CASES = [
    # tuples: items array and additionalItems
    {"$schema": D7, "type": "array", "items": [{"type": "integer"}, {"type": "string"}],
     "additionalItems": False},
    {"$schema": D4, "items": [{"type": "integer"}], "additionalItems": {"type": "string"}},
    # additionalItems without an items array means nothing
    {"$schema": D7, "items": {"type": "integer"}, "additionalItems": False},
    # draft-04 boolean exclusive bounds
    {"$schema": D4, "type": "number", "maximum": 5, "exclusiveMaximum": True},
    {"$schema": D4, "type": "number", "minimum": 1, "exclusiveMinimum": False},
    # keywords beside $ref are ignored before 2019-09
    {"$schema": D7, "definitions": {"i": {"type": "integer"}},
     "properties": {"a": {"$ref": "#/definitions/i", "type": "string", "description": "d"}}},
    # dependencies, both forms
    {"$schema": D7, "dependencies": {"x": ["y"], "y": {"properties": {"x": {"type": "string"}}}}},
    # fragment-only $id is an anchor (draft-06/07), id in draft-04
    {"$schema": D7, "definitions": {"i": {"$id": "#int", "type": "integer"}},
     "properties": {"a": {"$ref": "#int"}}},
    {"$schema": D4, "id": "http://example.com/root.json",
     "definitions": {"i": {"id": "#int", "type": "integer"}}, "properties": {"a": {"$ref": "#int"}}},
    {"$schema": D6, "definitions": {"s": {"$id": "s.json", "type": "string"}},
     "$id": "http://example.com/r.json", "properties": {"a": {"$ref": "s.json"}}},
    # a $ref into the items array follows it to prefixItems
    {"$schema": D7, "items": [{"type": "string"}], "properties": {"a": {"$ref": "#/items/0"}}},
    # 2019-09: $recursiveRef with the anchor at the root only
    {"$schema": D2019, "$recursiveAnchor": True, "type": "object",
     "properties": {"n": {"$recursiveRef": "#"}}, "additionalProperties": False},
    {"$schema": D2019, "items": [{"type": "integer"}], "additionalItems": {"type": "string"}},
]


@pytest.mark.parametrize("schema", CASES, ids=lambda s: json.dumps(s)[:60])
def test_translation_accepts_what_the_draft_accepts(schema: dict[str, Any]) -> None:
    out, checks = prepared(schema)
    assert "$schema" not in out
    original = jsonschema.validators.validator_for(schema)(schema)
    for doc in POOL:
        assert passes(doc, out, checks) == original.is_valid(doc), (doc, out)


def test_declared_draft() -> None:
    assert declared_draft({}) == 2020
    assert declared_draft({"$schema": D4}) == 4
    assert declared_draft({"$schema": D7 + "#"}) == 7
    assert declared_draft({"$schema": D2019}) == 2019
    with pytest.raises(UnsupportedSchemaError, match="draft-03"):
        declared_draft({"$schema": "http://json-schema.org/draft-03/schema#"})


def test_a_2020_schema_is_left_alone() -> None:
    schema = {"type": "array", "prefixItems": [{"type": "integer"}]}
    assert to_draft_2020(schema) is schema


def test_a_custom_meta_schema_is_refused_on_every_backend() -> None:
    """Its vocabularies may switch keywords off (the suite's vocabulary.json: ``minimum`` does
    not assert): refused by the front end, never compiled by a backend that ignores it."""
    custom = {"$schema": "http://localhost:1234/draft2020-12/metaschema-no-validation.json",
              "properties": {"n": {"minimum": 10}}}
    with pytest.raises(UnsupportedSchemaError, match="meta-schema") as e:
        to_draft_2020(custom)
    assert e.value.path == "$.$schema"
    for uri in ("https://json-schema.org/draft/2020-12/schema", "http://json-schema.org/schema#"):
        assert to_draft_2020({"$schema": uri, "type": "string"}) == {"type": "string"}


def test_validated_against_its_own_draft() -> None:
    with pytest.raises(SchemaValidationError, match="Draft7"):
        to_draft_2020({"$schema": D7, "minLength": -1})
    # valid in draft-04, not in 2020-12 (boolean exclusiveMaximum): accepted and translated
    assert to_draft_2020({"$schema": D4, "maximum": 1, "exclusiveMaximum": True}) == {
        "exclusiveMaximum": 1}


def test_a_ref_into_an_ignored_sibling_is_refused() -> None:
    schema = {"$schema": D7, "definitions": {"i": {"type": "integer"}},
              "properties": {"a": {"$ref": "#/definitions/i", "properties": {"b": {}}},
                             "c": {"$ref": "#/properties/a/properties/b"}}}
    with pytest.raises(UnsupportedSchemaError, match="ignores there"):
        to_draft_2020(schema)


def test_localized_refs_name_the_same_subschemas() -> None:
    schema = {"$id": "https://example.com/root.json",
              "$defs": {"A": {"$id": "a.json", "$defs": {"x": {"$anchor": "x", "type": "integer"}},
                              "$ref": "#x"},
                        "B": {"$id": "urn:uuid:deadbeef-1234-ffff-ffff-4321feebdaed",
                              "type": "string"}},
              "properties": {"a": {"$ref": "a.json"},
                             "b": {"$ref": "urn:uuid:deadbeef-1234-ffff-ffff-4321feebdaed"},
                             "c": {"$ref": "https://example.com/a.json#/$defs/x"}}}
    out = localize_refs(json.loads(json.dumps(schema)))
    assert out["$defs"]["A"]["$ref"] == "#/$defs/A/$defs/x"
    assert [out["properties"][k]["$ref"] for k in "abc"] == [
        "#/$defs/A", "#/$defs/B", "#/$defs/A/$defs/x"]
    assert "$id" not in out["$defs"]["A"] and "$anchor" not in out["$defs"]["A"]["$defs"]["x"]
    original = jsonschema.Draft202012Validator(schema)
    for doc in POOL + [{"a": 1, "b": "s", "c": 2}, {"a": "x"}, {"c": "x"}]:
        assert jsonschema.Draft202012Validator(out).is_valid(doc) == original.is_valid(doc), doc


def test_remote_refs_are_left_for_the_front_end() -> None:
    schema = {"properties": {"a": {"$ref": "http://localhost:1234/integer.json"}},
              "$defs": {"x": {"$anchor": "x"}}, "$ref": "#x"}
    out = localize_refs(schema)
    assert out["properties"]["a"]["$ref"] == "http://localhost:1234/integer.json"
    assert out["$ref"] == "#/$defs/x"
    with pytest.raises(UnsupportedSchemaError, match="remote"):
        prepared({"properties": {"a": {"$ref": "http://localhost:1234/integer.json"}}})


def test_dynamic_refs_with_one_anchor_per_name_are_plain_refs() -> None:
    schema = {"$defs": {"t": {"$dynamicAnchor": "t", "type": "integer"}},
              "items": {"$dynamicRef": "#t"}}
    out = localize_refs(schema)
    assert out["items"] == {"$ref": "#/$defs/t"} and "$dynamicAnchor" not in out["$defs"]["t"]
    # two anchors of one name: resolved by scope (dynamicrefs.py, test_fsm_dynamicrefs.py);
    # here no resource in scope binds "t", so the initial target is the one
    two = {"$defs": {"a": {"$id": "a", "$dynamicAnchor": "t"},
                     "b": {"$id": "b", "$dynamicAnchor": "t"}}, "items": {"$dynamicRef": "a#t"}}
    assert localize_refs(two)["items"] == {"$ref": "#/$defs/a"}


def test_pointers_round_trip_and_stay_readable() -> None:
    parts = ("$defs", "a b/c~d", "properties", "[x]+")
    assert pointer_parts(pointer(parts)) == parts
    assert pointer(("$defs", "name:1")) == "#/$defs/name:1"


def test_hoisted_targets_keep_their_meaning() -> None:
    schema = {"$ref": "#/if", "if": {"type": "integer", "minimum": 2},
              "properties": {"a": {"$ref": "#/x-defs/s"}}, "x-defs": {"s": {"type": "string"}}}
    out = hoist_ref_targets(json.loads(json.dumps(schema)))
    assert out["$ref"].startswith("#/$defs/") and out["properties"]["a"]["$ref"].startswith(
        "#/$defs/")
    original = jsonschema.Draft202012Validator(schema)
    for doc in POOL + [2, 3, {"a": "s"}]:
        assert jsonschema.Draft202012Validator(out).is_valid(doc) == original.is_valid(doc), doc


def test_a_ref_into_an_unknown_keyword_is_hoisted_before_the_keywords_are_checked() -> None:
    # nothing else in the schema asks for a rewrite: the oneOf is found only once hoisted
    schema = {"properties": {"a": {"$ref": "#/x-lib/u"}},
              "x-lib": {"u": {"oneOf": [{"type": "string"},
                                        {"type": "string", "maxLength": 2}]}}}
    out, checks = prepared(schema)
    assert out["properties"]["a"]["$ref"].startswith("#/$defs/")
    assert "oneOf" not in json.dumps(out["$defs"])
    original = jsonschema.Draft202012Validator(schema)
    for doc in POOL + [{"a": "abc"}, {"a": "ab"}, {"a": 1}]:
        assert passes(doc, out, checks) == original.is_valid(doc), doc
