"""When the backends refuse a schema whose conditions were rewritten into cases (llguidance
intersects them: "schema too large"), ``GrammarCompiler`` compiles its ``lean`` rewrite
instead: the conditions become run-time value checks. Model-free (byte-level tokenizer)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from tiny_models import eos_byte_tokenizer

from grammarserve.errors import GrammarBackendError, GrammarError
from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.conformance import walk


def _conditions(n: int) -> dict[str, Any]:
    """``n`` independent if/then members: 2**n cases once rewritten."""
    return {"type": "object", "allOf": [
        {"if": {"properties": {f"k{i}": {"const": 1}}, "required": [f"k{i}"]},
         "then": {"properties": {f"m{i}": {"type": "string"}}, "required": [f"m{i}"]}}
        for i in range(n)]}


@pytest.fixture(scope="module")
def byte_tok() -> Any:
    return eos_byte_tokenizer()


@pytest.fixture(scope="module")
def compiler(byte_tok: Any) -> GrammarCompiler:
    return GrammarCompiler(byte_tok, background_upgrade=False, open_schemas=True,
                           json_style="compact")


def test_cases_too_large_for_the_backend_become_checks(compiler: GrammarCompiler,
                                                        byte_tok: Any) -> None:
    schema = _conditions(8)
    with pytest.raises(GrammarBackendError, match="too large"):
        compiler.policy.compile(compiler.front.json_spec(schema))
    grammar = compiler.compile_json_schema(schema)
    assert {c.keyword for c in grammar.value_checks} == {"if"}
    validator = jsonschema.Draft202012Validator(schema)
    bitmask = compiler.allocate_bitmask(1)
    for doc in [{}, {"k0": 1, "m0": "x"}, {"k0": 1}, {"k3": 1, "m3": 2}, {"k3": 2},
                {"k1": 1, "k2": 1, "m1": "a", "m2": "b"}, {"k1": 1, "k2": 1, "m1": "a"}]:
        text = json.dumps(doc, separators=(",", ":"))
        ids = byte_tok.encode(text, add_special_tokens=False)
        ok, why = walk(grammar.matcher(), ids, compiler.stop_token_ids[0], bitmask)
        assert ok == validator.is_valid(doc), (doc, why)


def test_what_the_backend_takes_keeps_its_cases(compiler: GrammarCompiler) -> None:
    assert compiler.compile_json_schema(_conditions(2)).value_checks == ()


def test_without_value_checks_it_stays_refused() -> None:
    plain = GrammarCompiler(eos_byte_tokenizer(), background_upgrade=False, value_checks=False)
    with pytest.raises(GrammarError, match="too large"):
        plain.compile_json_schema(_conditions(8))
