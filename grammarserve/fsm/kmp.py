"""A byte string searched for across token boundaries (Knuth-Morris-Pratt): the state is how
many of its bytes end the text seen so far."""

from __future__ import annotations


class Kmp:
    """The automaton of ``pattern`` (non-empty bytes)."""

    def __init__(self, pattern: bytes) -> None:
        self.pattern = pattern
        # fail[i]: the length of the longest proper border of pattern[:i + 1]
        fail = [0] * len(pattern)
        k = 0
        for i in range(1, len(pattern)):
            while k and pattern[i] != pattern[k]:
                k = fail[k - 1]
            if pattern[i] == pattern[k]:
                k += 1
            fail[i] = k
        self._fail = fail

    def step(self, k: int, data: bytes) -> tuple[int, int | None]:
        """The state after ``data`` from state ``k``, and where in ``data`` the pattern first
        completed (the offset just past it; the state is then 0), or None."""
        pattern, fail = self.pattern, self._fail
        for i, b in enumerate(data):
            while k and pattern[k] != b:
                k = fail[k - 1]
            if pattern[k] == b:
                k += 1
                if k == len(pattern):
                    return 0, i + 1
        return k, None
