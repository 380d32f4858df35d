"""Jump-forward spans re-tokenized as the tokenizer writes their text (fsm/canonical.py)."""

from __future__ import annotations

from typing import Any

import pytest

from grammarserve.fsm.canonical import CanonicalSpans

pytestmark = pytest.mark.model


def _piece_ids(tok: Any, *pieces: str) -> list[int]:
    """One token per piece (how a backend's trie spells a span)."""
    ids = []
    for p in pieces:
        enc = tok.encode(p, add_special_tokens=False)
        assert len(enc) == 1, (p, enc)
        ids.append(enc[0])
    return ids


def test_backend_span_after_a_brace_becomes_the_tokenizers(tokenizer: Any) -> None:
    # what llguidance forced after '{' in the indented style (benchmarks/trajectory_diff.py)
    span = _piece_ids(tokenizer, "\n  ", '"', "ven", "dor", '":', ' "')
    ctx = tokenizer.encode("{", add_special_tokens=False)
    got = CanonicalSpans(tokenizer).canonical(ctx, span)
    want = tokenizer.encode('{\n  "vendor": "', add_special_tokens=False)[len(ctx):]
    assert [tokenizer.decode([t]) for t in got] == [tokenizer.decode([t]) for t in want]


def test_a_trailing_token_that_merges_with_what_follows_is_left_to_the_model(
        tokenizer: Any) -> None:
    # '": ' then 'true' is '":', ' true': the forced ' ' would be a split the model never saw
    span = tokenizer.encode('": ', add_special_tokens=False)
    ctx = tokenizer.encode('{"ok', add_special_tokens=False)
    got = CanonicalSpans(tokenizer).canonical(ctx, span)
    assert tokenizer.decode(got) == '":'


@pytest.mark.parametrize("before, text", [
    ("{", '"name": "'), ('", ', '"age": '), ("1,\n", '    "items": [\n      {\n        "'),
    ("", '{"a":'), ("x", "é\": "), ("]", "\n}"),
])
def test_canonical_spans_spell_a_prefix_of_the_span(tokenizer: Any, before: str,
                                                    text: str) -> None:
    ctx = tokenizer.encode(before, add_special_tokens=False) if before else []
    # the span as a trie would spell it: greedy longest tokens, differing from BPE's choice
    span = [tokenizer.convert_tokens_to_ids(t) for t in tokenizer.tokenize(text)]
    got = CanonicalSpans(tokenizer).canonical(ctx, span)
    assert text.startswith(tokenizer.decode(got))
    whole = tokenizer.encode(before + text, add_special_tokens=False)
    if got and whole[:len(ctx)] == ctx:  # an aligned context: exactly the tokenizer's tokens
        assert got == whole[len(ctx):len(ctx) + len(got)]
