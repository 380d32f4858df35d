"""An n-gram index over a growing token sequence: where each n-gram of ``MIN_N``..``MAX_N``
tokens last occurred, so a draft can continue the longest n-gram that ends the sequence from
its latest earlier occurrence (prompt lookup)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MIN_N = 2  # NOTE: single tokens repeat too often to predict what follows them
MAX_N = 4


@dataclass(frozen=True)
class Match:
    """An earlier occurrence of the sequence's last ``n`` tokens: its continuation is
    ``source[start:]``."""

    n: int
    source: Sequence[int]
    start: int


class NgramIndex:
    """The n-grams of one sequence (prompt + reply so far), updated as it grows."""

    def __init__(self) -> None:
        self._pos: dict[tuple[int, ...], int] = {}
        self._seen = 0  # continuations indexed: positions < _seen

    def update(self, tokens: Sequence[int]) -> None:
        """Index the positions added since the last call (a shorter sequence, after tokens
        were taken back, is indexed again from scratch)."""
        if len(tokens) < self._seen:
            self._pos.clear()
            self._seen = 0
        pos = self._pos
        for i in range(max(self._seen, MIN_N), len(tokens)):
            for n in range(MIN_N, min(MAX_N, i) + 1):
                pos[tuple(tokens[i - n:i])] = i
        self._seen = len(tokens)

    def match(self, tokens: Sequence[int], source: Sequence[int] | None = None) -> Match | None:
        """The longest n-gram ending ``tokens`` that occurred in the indexed sequence
        (``source``, ``tokens`` itself by default) with at least one token after it."""
        src = tokens if source is None else source
        for n in range(min(MAX_N, len(tokens)), MIN_N - 1, -1):
            i = self._pos.get(tuple(tokens[len(tokens) - n:]))
            if i is not None and i < len(src):
                return Match(n, src, i)
        return None
