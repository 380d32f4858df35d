"""Meta-validation: ``jsonschema_rs`` (fast path) and ``jsonschema`` (verdicts it does not
accept, messages) give the same verdicts, and errors still name the keyword and its path."""

from __future__ import annotations

from typing import Any

import pytest

from grammarserve.errors import SchemaValidationError
from grammarserve.fsm.schema.prepare import prepare_schema
from grammarserve.fsm.schema.read import metavalidate
from grammarserve.fsm.schema.read.metavalidate import meta_validate
from grammarserve.fsm.schema.tree import iter_subschemas

# NOTE: regexes are checked by Python's ``re`` on both paths, plus Unicode property escapes
# (``\p{L}``, ECMA ``u`` mode; ``fsm/patterns.py``)
_CASES: list[tuple[Any, str | None]] = [
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "^a+$"}}}, None),
    ({"properties": {"a": {"pattern": "\\p{L}+"}}}, None),
    ({"properties": {"a": {"pattern": "\\p{L+"}}}, "$.properties.a.pattern"),
    ({"patternProperties": {"(": {}}}, "$.patternProperties"),
    ({"properties": {"a": {"type": "strin"}}}, "$.properties.a.type"),
    ({"items": {"minLength": -1}}, "$.items.minLength"),
    ({"$ref": "not a uri %%"}, None),  # uri-reference: jsonschema has no checker installed
    ({"const": {"pattern": "("}}, None),  # a value, not a schema
    ({"minLength": 1.0}, None),
    (True, None),
]


@pytest.mark.parametrize("schema, path", _CASES)
def test_fast_and_slow_paths_agree(schema: Any, path: str | None) -> None:
    fast = metavalidate._fast_meta_validator()
    if fast is not None:
        assert fast(schema) is (path is None)
    for shallow in (True, False):  # False: jsonschema alone
        if path is None:
            meta_validate(schema, shallow=shallow)
            continue
        with pytest.raises(SchemaValidationError) as info:
            meta_validate(schema, shallow=shallow)
        assert info.value.path == path and path in str(info.value)


def test_deep_schema_is_refused_not_crashed() -> None:
    schema: dict[str, Any] = {}
    node = schema
    for _ in range(5000):
        node["items"] = {}
        node = node["items"]
    with pytest.raises(SchemaValidationError, match="nested too deeply"):
        prepare_schema(schema)


def test_prepared_schema_is_a_copy() -> None:
    schema: dict[str, Any] = {
        "type": "object", "properties": {"a": {"type": "array", "items": {"enum": [[1]]}}}}
    out = prepare_schema(schema)
    out["properties"]["a"]["items"]["enum"][0].append(2)
    assert schema["properties"]["a"]["items"]["enum"] == [[1]]


def test_iter_subschemas_order_and_paths() -> None:
    schema = {"properties": {"a": {"items": {"type": "string"}}, "b": True},
              "anyOf": [{"not": {}}, 3], "items": {}, "$defs": {"d": {}}}
    assert [p for _, p in iter_subschemas(schema)] == [
        (), ("items",), ("properties", "a"), ("properties", "a", "items"), ("$defs", "d"),
        ("anyOf", 0), ("anyOf", 0, "not")]
