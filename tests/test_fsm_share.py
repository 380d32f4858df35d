"""Identical leaf subschemas shared through one ``$defs`` entry (``schema/share.py``): the schema means
the same (same verdicts on instances), only repeated leaves that assert more than a type move,
and the grammar compiled from it accepts and refuses what the schema does."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest

from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.conformance import walk
from grammarserve.fsm.schema.share import PREFIX, share_leaves
from grammarserve.fsm.schema.tree import resolve_pointer

M = 2**53 - 1
INT = {"type": "integer", "minimum": -M, "maximum": M}


def _schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "a": dict(INT, description="first"),
            "b": dict(INT),
            "c": {"type": "array", "items": dict(INT), "prefixItems": [{"type": "string"}]},
            "d": {"type": "string"},
            "e": {"type": "string"},
            "f": {"anyOf": [dict(INT), {"type": "null"}]},
            "g": {"type": "object", "additionalProperties": {"enum": ["x", "y"]}},
            "h": {"enum": ["y", "x"]},
            "i": {"enum": ["x", "y"], "title": "same as g's values"},
        },
        "additionalProperties": False,
        "$defs": {"unused": dict(INT)},
    }


def test_repeated_leaves_become_one_entry() -> None:
    out = share_leaves(_schema())
    props = out["properties"]
    ref = props["a"]["$ref"]
    assert props["b"] == {"$ref": ref} and props["c"]["items"] == {"$ref": ref}
    assert resolve_pointer(out, ref) == INT  # annotations left out
    assert props["d"] == {"type": "string"}  # asserts only its type: left as it is
    assert props["f"]["anyOf"][0] == INT  # anyOf members are not shared
    assert out["$defs"]["unused"] == INT  # nor $defs entries
    assert props["g"]["additionalProperties"] == props["i"] != {"$ref": ref}
    assert props["h"] == {"enum": ["y", "x"]}  # another enum (order counts for the key)
    assert sorted(out["$defs"]) == sorted(["unused", f"{PREFIX}0", f"{PREFIX}1"])


def test_names_do_not_collide() -> None:
    schema = _schema()
    schema["$defs"][f"{PREFIX}0"] = {"type": "boolean"}
    out = share_leaves(schema)
    assert out["$defs"][f"{PREFIX}0"] == {"type": "boolean"}
    assert resolve_pointer(out, out["properties"]["a"]["$ref"]) == INT


@pytest.mark.parametrize("schema", [True, {"type": "object", "properties": {"a": INT}},
                                    {"properties": {"a": {"$ref": "#/$defs/x"}}}])
def test_nothing_to_share(schema: Any) -> None:
    assert share_leaves(copy.deepcopy(schema)) == schema


@pytest.mark.parametrize("instance,valid", [
    ({"a": 1, "b": -2, "c": ["s", 3], "g": {"k": "x"}, "i": "y"}, True),
    ({"a": M + 1}, False), ({"b": 1.5}, False), ({"c": ["s", M + 1]}, False),
    ({"g": {"k": "z"}}, False), ({"i": "z"}, False), ({"f": None, "h": "x"}, True),
])
def test_same_verdicts(instance: Any, valid: bool) -> None:
    before, after = _schema(), share_leaves(_schema())
    for schema in (before, after):
        assert jsonschema.Draft202012Validator(schema).is_valid(instance) is valid


@pytest.fixture(scope="module", params=["llguidance", "xgrammar"])
def compiler(request: pytest.FixtureRequest, tokenizer: Any) -> GrammarCompiler:
    if request.param == "xgrammar":
        return GrammarCompiler(tokenizer, backend="xgrammar", json_style="compact")
    return GrammarCompiler(tokenizer, backend="llguidance")


@pytest.mark.parametrize("instance,valid", [
    ({"a": 1, "b": -2, "c": ["s", 3], "g": {"k": "x"}, "i": "y"}, True),
    ({"a": 1, "b": M + 1}, False), ({"c": ["s", 1.5]}, False), ({"i": "z"}, False),
])
@pytest.mark.model
def test_compiled_grammar_keeps_the_language(compiler: GrammarCompiler, tokenizer: Any,
                                             instance: Any, valid: bool) -> None:
    grammar = compiler.compile_json_schema(_schema())
    ids = list(tokenizer.encode(json.dumps(instance, separators=(",", ":")),
                                add_special_tokens=False))
    ok, why = walk(grammar.matcher(), ids, compiler.stop_token_ids[0],
                   compiler.allocate_bitmask(1))
    assert ok == valid, why
