"""``uniqueItems`` over finite item domains rewritten exactly (``fsm/schema/rewrite/unique.py``);
open domains and too many arrays are refused with the path."""

from __future__ import annotations

from typing import Any

import pytest
from rewrite_helpers import assert_equivalent, rewritten

from grammarserve.errors import UnsupportedSchemaError
from grammarserve.fsm.schema.rewrite.unique import MAX_ARRAYS, unique_arrays


@pytest.mark.parametrize("schema", [
    {"type": "array", "items": {"enum": ["x", "y", "z"]}, "uniqueItems": True},
    {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True},
    {"items": {"type": "boolean"}, "uniqueItems": True},
    {"type": "array", "items": {"enum": [1, 1.0, 2]}, "uniqueItems": True, "minItems": 1},
    {"type": "array", "items": {"const": 1}, "uniqueItems": True},
    {"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "boolean"}],
     "items": False, "uniqueItems": True},
    {"type": "array", "prefixItems": [{"type": "boolean"}], "maxItems": 1, "uniqueItems": True},
    {"type": "array", "items": {"$ref": "#/$defs/c"}, "uniqueItems": True,
     "$defs": {"c": {"enum": ["x", "y"]}}},
    {"type": "array", "items": {"enum": ["x", "y", "z", 1, None]}, "maxItems": 2,
     "uniqueItems": True},
    {"type": "array", "items": {"type": "string", "enum": ["x", 1]}, "uniqueItems": True},
    {"type": "array", "uniqueItems": False},
])
def test_unique_items_is_rewritten_exactly(schema: dict[str, Any]) -> None:
    assert_equivalent(schema, extra=[[1, 2], [2, 1], [1, 1.0], [None, "x"], ["z", "x"],
                                     [False, False], ["x", 1]])


def test_enumerated_arrays() -> None:
    arrays = unique_arrays({}, {"items": {"type": "boolean"}})
    assert arrays == [[], [False], [False, True], [True], [True, False]]


@pytest.mark.parametrize("schema", [
    {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    {"type": "array", "uniqueItems": True},
    {"type": "array", "prefixItems": [{"type": "boolean"}], "uniqueItems": True},
])
def test_open_domains_stay_refused(schema: dict[str, Any]) -> None:
    with pytest.raises(UnsupportedSchemaError) as info:
        rewritten(schema)
    assert info.value.path == "$.uniqueItems"


def test_too_many_arrays_are_refused_with_a_message() -> None:
    schema = {"type": "array", "items": {"enum": list(range(6))}, "uniqueItems": True}
    with pytest.raises(UnsupportedSchemaError, match=f"more than {MAX_ARRAYS}") as info:
        rewritten(schema)
    assert info.value.path == "$.uniqueItems"
    assert_equivalent({**schema, "maxItems": 2})  # 1 + 6 + 30 arrays fit


def test_large_enums_are_counted_not_enumerated() -> None:
    import time

    schema = {"type": "array", "items": {"enum": [f"v{i}" for i in range(600)]},
              "uniqueItems": True}
    start = time.perf_counter()
    with pytest.raises(UnsupportedSchemaError, match=f"more than {MAX_ARRAYS}"):
        rewritten(schema)
    assert time.perf_counter() - start < 0.5
