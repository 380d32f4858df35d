"""The rewritten schemas through the real backends, on a synthetic byte-level vocabulary:
every instance a grammar accepts is valid against the schema as written (``jsonschema``), and
the listed valid instances are accepted."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from rewrite_helpers import POOL

from grammarserve.errors import GrammarError
from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.conformance import walk

SHIPPING = {
    "type": "object",
    "properties": {"country": {"type": "string", "enum": ["US", "CA"]},
                   "street": {"type": "string"}, "carrier": {"enum": ["courier", "post"]}},
    "required": ["country", "street", "carrier"], "additionalProperties": False,
    "if": {"properties": {"country": {"const": "US"}}},
    "then": {"properties": {"street": {"maxLength": 12}}},
    "else": {"properties": {"street": {"minLength": 3}}},
    "not": {"properties": {"carrier": {"const": "courier"},
                           "street": {"pattern": "^[Pp][Oo] [Bb]ox"}},
            "required": ["carrier", "street"]}}

# (schema, valid instances in schema key order that must be accepted, extra instances)
CASES: list[tuple[dict[str, Any], list[Any], list[Any]]] = [
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "not": {"required": ["a"]}}, [{"b": 1}, {}], [{"a": 1, "b": 1}]),
    ({"type": "string", "not": {"enum": ["ab", "ac", "b"]}}, ["a", "abc", "", "x"],
     ["ab", "ac", "b"]),
    ({"not": {"enum": [1, 2.5, True, None, "x"]}}, [False, 0, 2, 3, "y", []], [1, 2.5, "x"]),
    ({"type": "integer", "not": {"enum": [1, 2]}}, [0, 3, -1], [1, 2]),
    ({"type": "string", "not": {"pattern": "^[Pp][Oo] [Bb]ox"}}, ["Main St", "PO Bo", ""],
     ["PO Box 1", "po box"]),
    ({"type": "string", "not": {"pattern": "@\\{"}}, ["a@b{", "", "{@"], ["@{", "x@{y"]),
    ({"type": "string", "not": {"pattern": "^[0-9a-f]{4}-[0-9]{2}$"}}, ["12ab-3", "x"],
     ["12ab-34"]),
    (SHIPPING, [{"country": "US", "street": "1 Main St", "carrier": "courier"},
                {"country": "CA", "street": "PO Box 9", "carrier": "post"}],
     [{"country": "US", "street": "PO Box 9", "carrier": "courier"},
      {"country": "US", "street": "1234567890123", "carrier": "post"},
      {"country": "CA", "street": "ab", "carrier": "post"}]),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "dependentRequired": {"a": ["b"]}}, [{"a": 1, "b": 2}, {"b": 2}, {}], [{"a": 1}]),
    ({"type": "array", "items": {"enum": ["x", "y", "z"]}, "uniqueItems": True},
     [[], ["x"], ["z", "x"], ["y", "x", "z"]], [["x", "x"], ["x", "y", "x"]]),
    ({"type": "string", "oneOf": [{"minLength": 2}, {"maxLength": 4}]}, ["a", "abcde"],
     ["abc", "ab"]),
    ({"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "lives": {
        "type": "integer"}}, "required": ["kind"],
      "oneOf": [{"properties": {"kind": {"const": "cat"}}, "required": ["lives"]},
                {"properties": {"kind": {"const": "dog"}}}]},
     [{"kind": "cat", "lives": 9}, {"kind": "dog"}], [{"kind": "cat"}]),
    ({"properties": {"n": {"$ref": "http://json-schema.org/draft-07/schema#/definitions/"
                                   "nonNegativeInteger"}}}, [{"n": 0}, {"n": 7}],
     [{"n": -1}]),
]


@pytest.fixture(scope="module")
def byte_tokenizer() -> Any:
    from tiny_models import eos_byte_tokenizer

    return eos_byte_tokenizer()


@pytest.fixture(scope="module")
def compiler(byte_tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(byte_tokenizer, json_style="compact", open_schemas=True,
                           compile_timeout_s=120)


def test_xgrammar_takes_forbidden_keys_beside_closed_objects(compiler: GrammarCompiler,
                                                          byte_tokenizer: Any) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {
        "type": "integer"}}, "additionalProperties": False, "not": {"required": ["a"]}}
    c = compiler.with_backend("xgrammar")
    grammar = c.compile_json_schema(schema)
    bitmask = c.allocate_bitmask(1)
    for text, ok in (('{"b":1}', True), ('{"a":1}', False), ('{"a":1,"b":2}', False),
                     ("{}", True)):
        assert walk(grammar.matcher(), byte_tokenizer.encode(text), 0, bitmask)[0] == ok, text


@pytest.fixture(scope="module")
def closed(byte_tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(byte_tokenizer, json_style="compact", compile_timeout_s=120)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_rewritten_schema_is_sound_when_closed(closed: GrammarCompiler, byte_tokenizer: Any,
                                               case: int) -> None:
    """The default narrowing (``schema/close.py``) on top of the rewrites still accepts only valid
    instances."""
    schema, accepted, extra = CASES[case]
    grammar = closed.compile_json_schema(schema)
    check = jsonschema.Draft202012Validator(schema)
    bitmask = closed.allocate_bitmask(1)
    for instance in POOL + accepted + extra:
        ids = byte_tokenizer.encode(json.dumps(instance, separators=(",", ":")))
        ok = walk(grammar.matcher(), ids, 0, bitmask)[0]
        assert not ok or check.is_valid(instance), f"INVALID ACCEPTED {instance}"


@pytest.mark.parametrize("backend", ["auto", "xgrammar"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_rewritten_schema_is_exact_in_the_backend(compiler: GrammarCompiler,
                                                  byte_tokenizer: Any, case: int,
                                                  backend: str) -> None:
    schema, accepted, extra = CASES[case]
    c = compiler if backend == "auto" else compiler.with_backend("xgrammar")
    try:
        grammar = c.compile_json_schema(schema)
    except GrammarError:
        assert backend == "xgrammar"  # xgrammar's exact subset is smaller; auto compiles all
        return
    check = jsonschema.Draft202012Validator(schema)
    bitmask = c.allocate_bitmask(1)

    def walks(instance: Any) -> bool:
        ids = byte_tokenizer.encode(json.dumps(instance, separators=(",", ":")))
        return walk(grammar.matcher(), ids, 0, bitmask)[0]

    for instance in accepted:
        assert check.is_valid(instance) and walks(instance), instance
    for instance in POOL + extra:
        assert not walks(instance) or check.is_valid(instance), f"INVALID ACCEPTED {instance}"
