"""Schemas with no finite instance (a ``$ref`` cycle with no base case) are refused up front,
naming the ``$ref``: a backend given one never completes a value (issue 20: the engine grew by
gigabytes until the OOM killer ended it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from grammarserve.errors import GrammarError, SchemaValidationError
from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.schema.algebra.finite import check_finite
from grammarserve.fsm.schema.prepare import prepare_schema

SCHEMAS = sorted((Path(__file__).resolve().parents[1] / "schemas").glob("*.json"))
NODE = {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"]}

NO_BASE_CASE = [
    ({"$defs": {"a": NODE}, "$ref": "#/$defs/a"}, '$["$defs"].a.properties.x'),
    ({"type": "object", "properties": {"self": {"$ref": "#"}}, "required": ["self"]},
     "$.properties.self"),
    ({"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}},
                      "required": ["b"]},
                "b": {"type": "array", "items": {"$ref": "#/$defs/a"}, "minItems": 1}},
      "$ref": "#/$defs/a"}, '$["$defs"].a.properties.b'),
    ({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"allOf": [{"$ref": "#/$defs/a"}]}]}},
      "$ref": "#/$defs/a"}, '$["$defs"].a.anyOf[0]'),
]

WITH_BASE_CASE = [
    {"$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}}},
     "$ref": "#/$defs/a"},  # x is optional
    {"$defs": {"a": {"type": ["object", "null"], "properties": {"x": {"$ref": "#/$defs/a"}},
                     "required": ["x"]}}, "$ref": "#/$defs/a"},  # null ends it
    {"$defs": {"a": {"anyOf": [{"type": "string"}, {"type": "array",
                                                   "items": {"$ref": "#/$defs/a"}}]}},
     "$ref": "#/$defs/a"},
    {"$defs": {"a": {"type": "object", "properties": {"kids": {
        "type": "array", "items": {"$ref": "#/$defs/a"}}}, "required": ["kids"]}},
     "$ref": "#/$defs/a"},  # an empty array ends it
    {"properties": {"x": {"$ref": "#"}}, "required": ["x"]},  # no type: 1 is an instance
]


@pytest.mark.parametrize("schema,path", NO_BASE_CASE)
def test_recursion_without_base_case_is_refused_with_the_ref_path(schema: dict[str, Any],
                                                                  path: str) -> None:
    with pytest.raises(SchemaValidationError) as e:
        check_finite(prepare_schema(schema))
    assert e.value.path == path
    assert "no finite instance" in str(e.value)


@pytest.mark.parametrize("schema", WITH_BASE_CASE)
def test_recursion_with_a_base_case_is_kept(schema: dict[str, Any]) -> None:
    check_finite(prepare_schema(schema))


def test_the_corpus_is_kept() -> None:
    for path in SCHEMAS:
        try:
            schema = prepare_schema(json.loads(path.read_text())["schema"])
        except GrammarError:  # refused for another reason (covered elsewhere)
            continue
        check_finite(schema)


@pytest.mark.model
def test_compile_refuses_before_any_backend_runs(tokenizer: Any) -> None:
    """The engine-killing schema of issue 20 fails fast, every time, strict or not, as a
    GrammarError (HTTP 400): no backend ever sees it."""
    compiler = GrammarCompiler(tokenizer)
    schema = NO_BASE_CASE[0][0]
    for strict in (False, False, False, True):
        with pytest.raises(GrammarError) as e:
            compiler.compile_json_schema(schema, strict=strict)
        assert "no finite instance" in str(e.value) or strict
    # NOTE: tool parameters must be an object schema, so the cycle sits under one
    params = {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"],
              "$defs": schema["$defs"]}
    tools = [{"type": "function", "function": {"name": "f", "parameters": params}}]
    with pytest.raises(GrammarError, match="no finite instance"):
        compiler.compile_tool_calls(tools, "required")
    assert compiler.cache_stats().misses == 0  # nothing reached the compile cache
