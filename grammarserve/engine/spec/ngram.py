"""An n-gram index over a growing token sequence: where each n-gram of ``MIN_N``..``MAX_N``
tokens last occurred, so a draft can continue the longest n-gram that ends the sequence from
its latest earlier occurrence (prompt lookup).

N-grams are compared with each token's leading space folded away (``space_folded``): a value
copied from a document into a JSON string starts after the quote, so its first word is the
space-less token (``Kofi`` for the document's `` Kofi``), and without the fold no n-gram
through it would match the document until two words later."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MIN_N = 2  # NOTE: single tokens repeat too often to predict what follows them
MAX_N = 4
SPACE_MARKS = ("\u0120", "\u2581")  # a leading space in byte-level BPE and SentencePiece


def space_folded(vocab: Mapping[str, int], size: int) -> list[int]:
    """For each token id below ``size``, the id of the same token without its leading space
    where the vocabulary has one, else the id itself."""
    fold = list(range(size))
    for text, i in vocab.items():
        if i < size and len(text) > 1 and text[0] in SPACE_MARKS:
            fold[i] = vocab.get(text[1:], i)
    return fold


@dataclass(frozen=True)
class Match:
    """An earlier occurrence of the sequence's last ``n`` tokens: its continuation is
    ``source[start:]``."""

    n: int
    source: Sequence[int]
    start: int


class NgramIndex:
    """The n-grams of one sequence (prompt + reply so far), updated as it grows; ``fold``:
    :func:`space_folded` (None: tokens compared as they are)."""

    def __init__(self, fold: Sequence[int] | None = None) -> None:
        self._fold = fold
        self._keys: list[int] = []  # the indexed tokens, folded
        self._pos: dict[tuple[int, ...], int] = {}
        self._seen = 0  # continuations indexed: positions < _seen

    def update(self, tokens: Sequence[int]) -> None:
        """Index the positions added since the last call (a shorter sequence, after tokens
        were taken back, is indexed again from scratch)."""
        if len(tokens) < self._seen:
            self._pos.clear()
            self._seen = 0
            self._keys.clear()
        keys, fold = self._keys, self._fold
        del keys[self._seen:]
        keys.extend(tokens[len(keys):] if fold is None else self._folded(tokens[len(keys):]))
        pos = self._pos
        for i in range(max(self._seen, MIN_N), len(tokens)):
            for n in range(MIN_N, min(MAX_N, i) + 1):
                pos[tuple(keys[i - n:i])] = i
        self._seen = len(tokens)

    def _folded(self, tokens: Sequence[int]) -> list[int]:
        """``tokens`` folded; an id the fold does not cover (outside the vocabulary: the batch
        entry check fails its request later, which must not be an IndexError here first, in
        every request's step) is kept as it is."""
        fold = self._fold
        assert fold is not None
        size = len(fold)
        return [fold[t] if 0 <= t < size else t for t in tokens]

    def match(self, tokens: Sequence[int], source: Sequence[int] | None = None) -> Match | None:
        """The longest n-gram ending ``tokens`` that occurred in the indexed sequence
        (``source``, ``tokens`` itself by default) with at least one token after it."""
        src = tokens if source is None else source
        tail = tokens[max(len(tokens) - MAX_N, 0):]
        if self._fold is not None:
            tail = self._folded(tail)
        for n in range(min(MAX_N, len(tail)), MIN_N - 1, -1):
            i = self._pos.get(tuple(tail[len(tail) - n:]))
            if i is not None and i < len(src):
                return Match(n, src, i)
        return None
