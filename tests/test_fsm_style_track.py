"""The JSON style tracker (``style_track.py``): on a small synthetic vocabulary, exactly the
compact and the spaced forms keep a style, whatever the tokenization; its tables agree with a
byte-by-byte reading of every token from every state."""

from __future__ import annotations

import itertools
import json
import random

import numpy as np
import pytest

from grammarserve.fsm.style_track import STATES, StyleTable, StyleTracker, _step

VOCAB = [b"", b"{", b"}", b"[", b"]", b'"', b",", b":", b" ", b", ", b": ", b'",', b'":',
         b'": ', b'", ', b'"}', b"a", b"ab", b" a", b"\\", b'\\"', b"1", b"12", b"  ", b",\"",
         b":\"", b"\"a\"", b"true", b"null", b" \"", b"\n", b"}, ", b"],", b"x y", b"a,b"]
VOCAB += [bytes([c]) for c in range(0x20, 0x7F) if bytes([c]) not in VOCAB]
INSTANCES = [{"a": 1, "b": [1, 2, {"c": "x, y: z"}]}, ["a", "b c", {"d": None}],
             {"k": "quote \" and back\\slash, then: space "}, [], {}, {"e": {}}, "a, b: c"]


def _tokenize(text: bytes, rng: random.Random) -> list[int]:
    """A random tokenization of ``text`` over ``VOCAB`` (every printable byte is a token)."""
    index = {tok: i for i, tok in enumerate(VOCAB) if tok}
    ids, pos = [], 0
    while pos < len(text):
        options = [tok for tok in index if text.startswith(tok, pos)]
        tok = rng.choice(options)
        ids.append(index[tok])
        pos += len(tok)
    return ids


def _follows(tracker: StyleTracker, ids: list[int]) -> bool:
    width = (len(VOCAB) + 31) // 32
    for t in ids:
        row = np.full(width, -1, dtype=np.int32)
        tracker.apply(row)
        if not (int(row[t // 32]) >> (t % 32)) & 1:
            return False
        tracker.advance(t)
    return True


@pytest.fixture(scope="module")
def table() -> StyleTable:
    return StyleTable(VOCAB, len(VOCAB) + 3)  # a few ids past the token table (special)


def test_the_tables_read_each_token_byte_by_byte(table: StyleTable) -> None:
    for state, (t, text) in itertools.product(range(STATES), enumerate(VOCAB)):
        expected = state
        for byte in text:
            expected = _step(expected, byte)
        assert int(table.after[state, t]) == expected, (state, text)
        allowed = bool((int(table.allowed[state][t // 32]) >> (t % 32)) & 1)
        assert allowed is (expected != STATES), (state, text)


@pytest.mark.parametrize("seed", range(5))
def test_compact_and_spaced_forms_keep_a_style_however_tokenized(table: StyleTable,
                                                                 seed: int) -> None:
    rng = random.Random(seed)
    for instance in INSTANCES:
        for kwargs in ({}, {"separators": (",", ":")}):
            text = json.dumps(instance, **kwargs).encode()
            assert _follows(StyleTracker(table), _tokenize(text, rng)), text


@pytest.mark.parametrize("text", [
    '{"a": 1,"b": 2}', '{"a":1, "b":2}', '{"a": [1,2]}', '{ "a":1}', '{"a":1 }',
    '{"a":  1}', '[1, 2,3]', ' [1]', '{"a":\n1}', '{"a": {"b":1}}'])
def test_mixed_or_extra_whitespace_is_refused(table: StyleTable, text: str) -> None:
    rng = random.Random(0)
    for _ in range(5):
        assert not _follows(StyleTracker(table), _tokenize(text.encode(), rng)), text


def test_style_rollback_and_permits(table: StyleTable) -> None:
    tracker = StyleTracker(table)
    ids = _tokenize(b'{"a": 1', random.Random(1))
    assert _follows(tracker, ids) and tracker.style == "spaced"
    tracker.rollback(len(ids))
    assert tracker.style == "undecided"
    compact = _tokenize(b'{"a":1,"b":2}', random.Random(2))
    assert tracker.permits(compact) == len(compact)
    spaced_after = [VOCAB.index(b"{"), VOCAB.index(b'"a"'), VOCAB.index(b":"),
                    VOCAB.index(b"1"), VOCAB.index(b", ")]
    assert tracker.permits(spaced_after) == 4  # compact from the key on: ", " breaks it
    assert tracker.style == "undecided"  # permits only looks ahead
    special = len(VOCAB)  # no bytes: allowed anywhere, changes nothing
    assert tracker.permits([special]) == 1
