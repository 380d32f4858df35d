"""Bounded runs of characters outside JSON strings, enforced next to the grammar backend.

Two bounds use it:

- whitespace (space, tab, CR, LF): xgrammar's own ``max_whitespace_cnt`` makes masks ~4x slower
  (3 us -> 13 us p50 on schemas/), so the ``flexible`` style compiles unbounded whitespace and a
  matcher-side tracker removes the tokens that would exceed the bound;
- digits: a number the schema does not bound may otherwise never end
  (``"population": 11122222222...``); by default no run of digits outside strings is longer
  than 20: a double's 17 significant digits, as shortest round-trip printers write them,
  with room for leading zeros (``0.00012345678901234567``). ``.`` is transparent
  (``123.456`` is one run of 6), anything else ends the run. Integers are bounded by the
  schema rewrite in ``schema/close.py`` (+-(2**53 - 1)).

Invariant: outside JSON strings, no run of the bounded characters is longer than ``limit``. A
token is allowed when its leading run fits the budget left by the current run and no later run
*outside strings* inside it exceeds ``limit``; the lexer state (in string, after backslash,
current run) is tracked from the accepted tokens' bytes.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

import numpy as np

WHITESPACE = frozenset(b" \t\r\n")
DIGITS = frozenset(b"0123456789")
S = TypeVar("S")
#: Longest run of digits outside strings (17 significant digits of a double + leading zeros).
MAX_DIGITS = 20


class RunBudget:
    """Per-vocabulary tables for one character class: for each remaining budget ``b``, the
    packed bitmask of tokens allowed outside strings, and the masks of tokens allowed inside a
    string (plain or right after a backslash)."""

    def __init__(self, token_bytes: list[bytes], vocab_size: int, limit: int,
                 chars: frozenset[int] = WHITESPACE, transparent: frozenset[int] = frozenset()
                 ) -> None:
        self.limit = limit
        self.token_bytes = token_bytes
        self.chars = chars
        self.transparent = transparent
        lead = np.zeros(vocab_size, dtype=np.int64)
        inner = np.zeros((3, vocab_size), dtype=np.int64)  # start: outside, inside, escaped
        for t, text in enumerate(token_bytes[:vocab_size]):
            if not text or not (chars & set(text)):
                continue
            lead[t], inner[0, t] = self._scan(text, False, False)
            inner[1, t] = self._scan(text, True, False)[1]
            inner[2, t] = self._scan(text, True, True)[1]
        width = (vocab_size + 31) // 32
        ok = inner <= limit
        self.inside = pack_mask(ok[1], width)
        self.escaped = pack_mask(ok[2], width)
        self.inside_all = bool(ok[1].all() and ok[2].all())
        self.outside = np.stack([pack_mask(ok[0] & (lead <= b), width) for b in range(limit + 1)])
        self.outside_all = bool(ok[0].all())
        self.max_lead = int(lead.max(initial=0))

    def _mask(self, in_string: bool, escape: bool, run: int) -> np.ndarray | None:
        """The packed bitmask of the tokens allowed in this state (None: all of them)."""
        if in_string:
            if self.inside_all:
                return None
            return self.escaped if escape else self.inside
        budget = self.limit - run
        if budget >= self.max_lead and self.outside_all:
            return None
        return self.outside[max(budget, 0)]  # type: ignore[no-any-return]

    def apply(self, row: np.ndarray, in_string: bool, escape: bool, run: int) -> None:
        """AND the allowed tokens for this state into ``row`` (one bitmask row, as a numpy
        int32 view: ~1 us, where a torch op costs ~7 us of dispatch)."""
        mask = self._mask(in_string, escape, run)
        if mask is not None:
            np.bitwise_and(row, mask, out=row)

    def allows(self, token_id: int, in_string: bool, escape: bool, run: int) -> bool:
        """Whether this state allows ``token_id`` (one bit read, no row built)."""
        mask = self._mask(in_string, escape, run)
        return mask is None or bool((int(mask[token_id >> 5]) >> (token_id & 31)) & 1)

    def advance(self, state: tuple[bool, bool, int], text: bytes) -> tuple[bool, bool, int]:
        """The lexer state after ``text``."""
        in_string, escape, run = state
        for c in text:
            if in_string:
                if escape:
                    escape = False
                elif c == 0x5C:  # backslash
                    escape = True
                elif c == 0x22:  # quote
                    in_string, run = False, 0
            elif c in self.chars:
                run += 1
            elif c not in self.transparent:
                in_string, run = c == 0x22, 0
        return in_string, escape, run

    def _scan(self, text: bytes, in_string: bool, escape: bool) -> tuple[int, int]:
        """(leading run outside strings, longest later run outside strings)."""
        lead, leading, run, best = 0, not in_string, 0, 0
        for c in text:
            if in_string:
                if escape:
                    escape = False
                elif c == 0x5C:
                    escape = True
                elif c == 0x22:
                    in_string, run = False, 0
                leading = False
            elif c in self.chars:
                if leading:
                    lead += 1
                else:
                    run += 1
                    best = max(best, run)
            elif c not in self.transparent:
                leading, run = False, 0
                in_string = c == 0x22
        return lead, best


def digit_budget(token_bytes: list[bytes], vocab_size: int, limit: int = MAX_DIGITS) -> RunBudget:
    """The digits bound (``.`` transparent)."""
    return RunBudget(token_bytes, vocab_size, limit, DIGITS, frozenset(b"."))


def pack_mask(allowed: np.ndarray, width: int) -> np.ndarray:
    """``allowed`` (bool per token) as a bitmask row of ``width`` int32 words."""
    padded = np.zeros(width * 32, dtype=bool)
    padded[:allowed.shape[0]] = allowed
    return np.packbits(padded, bitorder="little").view(np.int32).copy()


class LexTracker(Protocol):
    """A lexical bound applied on top of a backend's masks (``RunTracker``,
    ``style_track.StyleTracker``), following the accepted tokens."""

    def apply(self, row: np.ndarray) -> None:
        """AND the tokens allowed now into ``row`` (a numpy int32 bitmask row)."""

    def advance(self, token_id: int) -> None:
        """Follow an accepted token."""

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` tokens."""

    def permits(self, tokens: list[int]) -> int:
        """How many of ``tokens``, accepted in order from now, the bound allows."""


class HistoryTracker(Generic[S]):
    """A tracker's state with its history, for rollback (shared by the lexical trackers)."""

    def __init__(self, state: S) -> None:
        self.state = state
        self.history: list[S] = []

    def _push(self, state: S) -> None:
        self.history.append(self.state)
        self.state = state

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` tokens."""
        for _ in range(min(n, len(self.history))):
            self.state = self.history.pop()


class RunTracker(HistoryTracker[tuple[bool, bool, int]]):
    """Per-matcher JSON lexical state for one :class:`RunBudget` (in string, escape, current
    run), with history for rollback."""

    def __init__(self, budget: RunBudget) -> None:
        super().__init__((False, False, 0))
        self.budget = budget

    def apply(self, row: np.ndarray) -> None:
        """Restrict ``row`` (numpy int32 view) to the tokens that keep the runs bounded."""
        self.budget.apply(row, *self.state)

    def advance(self, token_id: int) -> None:
        """Update the state with an accepted token."""
        self._push(self.budget.advance(self.state, self.budget.token_bytes[token_id]))

    def permits(self, tokens: list[int]) -> int:
        """How many of ``tokens``, accepted in order from now, keep the runs bounded."""
        state = self.state
        for i, t in enumerate(tokens):
            if not self.budget.allows(t, *state):
                return i
            state = self.budget.advance(state, self.budget.token_bytes[t])
        return len(tokens)
