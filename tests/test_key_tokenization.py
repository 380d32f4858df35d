"""Where a JSON schema forces a key's text, ``force_tokenization=False`` (the engine's default)
lets llguidance allow every split of it, as xgrammar does, so the model spells the key in the
tokens it prefers (issue 32: SmolLM2 writes ``in`` + ``vo`` + ``ice`` where the tokenizer's own
split is ``inv`` + ``oice``); with it, llguidance allows only the tokenizer's split."""

from __future__ import annotations

from typing import Any

import pytest
from walk_helpers import allowed_tokens

from grammarserve.fsm import GrammarCompiler

pytestmark = pytest.mark.model

SCHEMA = {"type": "object", "properties": {"vendor": {"type": "string"},
                                           "invoice_number": {"type": "string"}},
          "required": ["vendor", "invoice_number"]}
BEFORE = '{\n  "vendor": "X",\n  "'  # the next key is forced: invoice_number


def _at_key(tokenizer: Any, backend: str, force: bool) -> tuple[Any, GrammarCompiler]:
    compiler = GrammarCompiler(tokenizer, backend=backend, json_style="flexible",
                               force_tokenization=force, background_upgrade=False)
    m = compiler.compile_json_schema(SCHEMA).matcher()
    for t in tokenizer.encode(BEFORE, add_special_tokens=False):
        assert m.accept_token(t), m.error()
    return m, compiler


def _allowed(tokenizer: Any, m: Any, compiler: GrammarCompiler) -> set[str]:
    bitmask = compiler.allocate_bitmask(1)
    m.fill_bitmask(bitmask, 0)
    return {tokenizer.decode([t]) for t in allowed_tokens(bitmask)}


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_every_split_of_a_forced_key_is_allowed(tokenizer: Any, backend: str) -> None:
    m, compiler = _at_key(tokenizer, backend, force=False)
    assert {"i", "in", "inv"} <= _allowed(tokenizer, m, compiler)
    for piece in ("in", "vo", "ice", "_", "number", '":', ' "', "7", '"', "\n}"):
        for t in tokenizer.encode(piece, add_special_tokens=False):
            assert m.accept_token(t), (piece, m.error())
    assert m.accept_token(tokenizer.eos_token_id) and m.is_terminated()
    assert m.forced_tokens() == []


def test_forcing_llguidance_allows_the_tokenizers_split_only(tokenizer: Any) -> None:
    m, compiler = _at_key(tokenizer, "llguidance", force=True)
    assert _allowed(tokenizer, m, compiler) == {"inv"}
    assert tokenizer.decode(m.forced_tokens()).startswith("invoice_number")
