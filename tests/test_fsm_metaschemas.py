"""``$ref``s into the JSON Schema meta-schemas resolve locally (``fsm/schema/read/metaschemas.py``)."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest
from rewrite_helpers import rewritten

from grammarserve.errors import UnsupportedSchemaError
from grammarserve.fsm.schema.read.metaschemas import is_meta_ref, translate_draft
from grammarserve.fsm.schema.tree import iter_subschemas


@pytest.mark.parametrize("ref, good, bad", [
    ("http://json-schema.org/draft-07/schema#/definitions/nonNegativeInteger", [0, 5], [-1, "a"]),
    ("http://json-schema.org/draft-07/schema#/definitions/simpleTypes", ["string"], ["str", 1]),
    ("http://json-schema.org/draft-06/schema#/definitions/nonNegativeIntegerDefault0", [0],
     [-1]),
    ("http://json-schema.org/draft-04/schema#/definitions/positiveInteger", [0, 3], [-1]),
    ("https://json-schema.org/draft/2020-12/meta/validation#/$defs/nonNegativeInteger", [0],
     [-2]),
    ("https://json-schema.org/draft/2019-09/meta/validation#/$defs/simpleTypes", ["null"],
     ["nil"]),
])
def test_meta_refs_resolve_locally(ref: str, good: list[Any], bad: list[Any]) -> None:
    assert is_meta_ref(ref)
    out = rewritten({"type": "object", "properties": {"x": {"$ref": ref}}})
    refs = [sub["$ref"] for sub, _ in iter_subschemas(out) if "$ref" in sub]
    assert refs and all(r.startswith("#/$defs/meta_") for r in refs)
    check = jsonschema.Draft202012Validator(out)
    for value in good:
        assert check.is_valid({"x": value}), value
    for value in bad:
        assert not check.is_valid({"x": value}), value


def test_older_drafts_are_translated() -> None:
    old = {"type": "array", "items": [{"type": "string"}], "additionalItems": False,
           "dependencies": {"a": ["b"], "c": {"required": ["d"]}},
           "properties": {"n": {"type": "number", "maximum": 3, "exclusiveMaximum": True},
                          "m": {"minimum": 1, "exclusiveMinimum": False}},
           "definitions": {"x": {"type": "null"}}}
    new = translate_draft(copy.deepcopy(old), 4)
    assert new == {"type": "array", "prefixItems": [{"type": "string"}], "items": False,
                   "dependentRequired": {"a": ["b"]},
                   "dependentSchemas": {"c": {"required": ["d"]}},
                   "properties": {"n": {"type": "number", "exclusiveMaximum": 3},
                                  "m": {"minimum": 1}},
                   "$defs": {"x": {"type": "null"}}}


def test_whole_draft7_meta_schema_is_bundled_then_refused_for_unique_items() -> None:
    # NOTE: "#" is the whole meta-schema; its "type" arrays are unique over 7 names (13699
    # arrays), more than the enumeration bound
    with pytest.raises(UnsupportedSchemaError, match="uniqueItems"):
        rewritten({"$ref": "http://json-schema.org/draft-07/schema#/definitions/schemaArray"})


def test_open_unique_items_in_a_meta_part_stays_refused() -> None:
    with pytest.raises(UnsupportedSchemaError, match="uniqueItems"):
        rewritten({"$ref": "http://json-schema.org/draft-07/schema#/definitions/stringArray"})


def test_other_remote_refs_stay_refused() -> None:
    assert not is_meta_ref("https://example.com/schema.json")
    with pytest.raises(UnsupportedSchemaError, match="remote"):
        rewritten({"$ref": "https://example.com/schema.json"})


def test_dangling_meta_pointer_is_refused_with_path() -> None:
    with pytest.raises(UnsupportedSchemaError) as info:
        rewritten({"properties": {"a": {
            "$ref": "http://json-schema.org/draft-07/schema#/definitions/nope"}}})
    assert info.value.path == '$.properties.a["$ref"]'
