"""No backend lets a special (control) token into the output: it has no text (the detokenizer
drops it), so a grammar that counted ``<|im_start|>`` as literal string content would accept
output whose visible text fails the schema's length or pattern. Stop tokens end the output
exactly where the grammar may end. On the embedded model's tokenizer (SmolLM2: 17 special
tokens, ``<|im_end|>`` the stop token)."""

from __future__ import annotations

from typing import Any

import pytest

from grammarserve.fsm import GrammarCompiler

pytestmark = pytest.mark.model  # the embedded model's tokenizer

#: (kind, compile arguments, a prefix ending inside free content, a complete output)
CASES: list[tuple[str, tuple[Any, ...], str, str]] = [
    ("json_schema", ({"type": "object", "properties": {"s": {"type": "string"}},
                      "required": ["s"], "additionalProperties": False},),
     '{"s": "ab', '{"s": "ab"}'),
    ("json_schema", ({"type": "string", "pattern": "^[a-z ]{3,}$"},), '"a', '"abc"'),
    ("regex", (r"[^\n]{1,40}\.",), "hello ", "hello there."),
]


def _allowed(compiler: GrammarCompiler, matcher: Any) -> set[int]:
    bitmask = compiler.allocate_bitmask(1)
    matcher.fill_bitmask(bitmask, 0)
    words = bitmask[0].tolist()
    return {t for t in range(compiler.vocab_size) if (words[t >> 5] >> (t & 31)) & 1}


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
@pytest.mark.parametrize("kind,args,inside,complete", CASES)
def test_no_special_token_inside_and_stop_only_at_the_end(
        tokenizer: Any, backend: str, kind: str, args: tuple[Any, ...], inside: str,
        complete: str) -> None:
    compiler = GrammarCompiler(tokenizer, backend=backend, json_style="spaced",
                               background_upgrade=False)
    special = set(compiler.vocab.special_token_ids)
    stops = set(compiler.stop_token_ids)
    assert len(special) == 17 and stops <= special  # SmolLM2's control tokens, <|im_end|>
    grammar = compiler.compile_async(kind, *args).result()
    assert grammar.backend == backend

    matcher = grammar.matcher()
    for token in tokenizer.encode(inside, add_special_tokens=False):
        assert matcher.accept_token(token)
    allowed = _allowed(compiler, matcher)
    assert len(allowed) > 1000  # free content: most of the vocabulary
    assert not allowed & special, sorted(allowed & special)

    matcher = grammar.matcher()
    for token in tokenizer.encode(complete, add_special_tokens=False):
        assert matcher.accept_token(token)
    assert _allowed(compiler, matcher) & special <= stops
    assert _allowed(compiler, matcher) & stops == stops


def test_the_special_tokens_are_the_tokenizers(tokenizer: Any) -> None:
    compiler = GrammarCompiler(tokenizer, background_upgrade=False)
    ids = compiler.vocab.special_token_ids
    assert tokenizer.convert_ids_to_tokens(list(ids[:3])) == [
        "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert all(tokenizer.decode([t], skip_special_tokens=True) == "" for t in ids)
