"""A guard against array loops in generated JSON: a small model that has written a document's
items often keeps writing them (``[A, B, A, B, ...]`` or ``[A, A, A, ...]``) until
``max_tokens`` cuts the reply, which then is no JSON at all.

:class:`LoopGuardMatcher` wraps a JSON matcher and follows the document (``json_track.py``).
When an array item that is an object or an array closes as an exact copy (JSON equality) of an
earlier item of the same array for the ``repeats``-th time, the copy is taken back, together
with the token that closed the item before it, and the array is closed there: from then on
until the array closes, no token may write a comma at the array's level or inside its last
item (so the model ends the item and the array in its own tokens). Scalars (``[1, 1, 2]``)
are never guarded; items that differ in any value are never guarded.

The guard never makes a reply invalid: it only removes allowed tokens, and where that would
leave none (``minItems`` not yet met), it removes none. The caller drops the taken-back tokens
like a failed value check's (``take_retraction``), and streams hold back the text the guard
may still take back (``held_from``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import torch

from grammarserve.fsm.json_track import LEX_ESC, LEX_IN, LEX_OUT, Closed, JsonTracker, Path
from grammarserve.fsm.matcher import Matcher, SharedMasks
from grammarserve.fsm.value_check import identity
from grammarserve.fsm.vocab import VocabInfo

#: Depth offsets a token's commas are recorded at (relative to the depth it starts at).
_SPAN = 8


class CommaTable:
    """For each token holding a comma, at which container depths (relative to where the token
    starts) it writes a comma outside strings, per start state. Built once per vocabulary and
    shared by every guard of an engine."""

    def __init__(self, token_bytes: list[bytes]) -> None:
        self.token_bytes = token_bytes
        ids = [t for t, b in enumerate(token_bytes) if b and 0x2C in b]
        self.ids = np.array(ids, dtype=np.int64)
        self.depths = np.zeros((3, len(ids)), dtype=np.int64)  # bit (d + _SPAN) per state
        for j, t in enumerate(ids):
            for state in (LEX_OUT, LEX_IN, LEX_ESC):
                self.depths[state, j] = _comma_depths(token_bytes[t], state)

    def banned(self, state: int, levels: list[int]) -> np.ndarray:
        """The comma tokens that, started in ``state``, write a comma at one of the relative
        depths ``levels``."""
        want = 0
        for d in levels:
            if -_SPAN <= d < _SPAN:
                want |= 1 << (d + _SPAN)
        return self.ids[(self.depths[state] & want) != 0]


def _comma_depths(data: bytes, state: int) -> int:
    bits, depth, in_str, esc = 0, 0, state != LEX_OUT, state == LEX_ESC
    for c in data:
        if in_str:
            if esc:
                esc = False
            elif c == 0x5C:
                esc = True
            elif c == 0x22:
                in_str = False
        elif c == 0x22:
            in_str = True
        elif c in b"{[":
            depth += 1
        elif c in b"]}":
            depth -= 1
        elif c == 0x2C and -_SPAN <= depth < _SPAN:
            bits |= 1 << (depth + _SPAN)
    return bits


@dataclass
class _Closing:
    """An array the guard closes: its path and depth, from which accepted token on."""

    path: Path
    depth: int  # the tracker's depth inside the array (its items open at depth + 1)
    since: int


class LoopGuardMatcher(Matcher):
    """A JSON matcher plus the array loop guard (see the module docstring)."""

    retracts = True

    def __init__(self, vocab: VocabInfo, inner: Matcher, table: CommaTable,
                 repeats: int) -> None:
        # NOTE: the guard's bans change masks, so no shared prefix masks here (the inner
        # matcher keeps its own)
        uncached = SharedMasks()
        uncached.MAX_ENTRIES = 0
        super().__init__(vocab, uncached)
        self._inner, self._table, self._bytes = inner, table, table.token_bytes
        self._repeats = repeats
        self._tracker = JsonTracker()
        self._starts: list[int] = []  # byte offset of each accepted token in the document
        self._dups: dict[Path, int] = {}  # array -> items that repeated an earlier one
        self._ids: dict[tuple[int, int], str] = {}
        self._closing: _Closing | None = None
        self._fire: int | None = None  # set by _accept: the token to go back to
        self._retracted = 0
        self.guarded = 0  # loops cut
        self._cuts = 0  # loops cut since the last take_guard_cuts

    @property
    def exhausted(self) -> bool:  # type: ignore[override]
        return self._inner.exhausted

    # -- public additions ------------------------------------------------------------------
    def accept_token(self, token_id: int) -> bool:
        """As :meth:`Matcher.accept_token`; a token that closes the ``repeats``-th copy of an
        earlier array item is accepted and then taken back with the copy (see
        :meth:`take_retraction`)."""
        if not super().accept_token(token_id):
            return False
        inner_back = self._inner.take_retraction()
        if inner_back:  # a value check of the inner matcher took tokens back
            self._forget(inner_back)
            self._retracted += inner_back
            return True
        back, self._fire = self._fire, None
        if back is not None:
            n = len(self._starts) - back
            self.rollback(n)
            self._retracted += n
            self.guarded += 1
            self._cuts += 1
        return True

    def accept_draft(self, token_id: int) -> bool:
        """As :meth:`Matcher.accept_draft`: refused where the inner matcher's value check or
        this guard would take tokens back."""
        if not self._inner.accept_draft(token_id):
            return False
        self._inner.rollback(1)  # NOTE: checked alone first; now through this guard's state
        if not Matcher.accept_token(self, token_id):
            return False
        if self._fire is None:
            return True
        self._fire = None
        self.rollback(1)
        return False

    def draft_mark(self) -> tuple[object, ...]:
        return (self._closing, dict(self._dups), self._fire, self._inner.draft_mark())

    def draft_restore(self, mark: tuple[object, ...]) -> None:
        closing, dups, fire, inner = mark
        self._closing, self._dups, self._fire = closing, dups, fire  # type: ignore[assignment]
        self._inner.draft_restore(inner)  # type: ignore[arg-type]

    def take_retraction(self) -> int:
        n, self._retracted = self._retracted, 0
        return n

    def take_guard_cuts(self) -> int:
        """How many copies the guard took back since the last call (then reset): the part of
        :meth:`take_retraction`'s tokens that were a loop, not a failed value check."""
        n, self._cuts = self._cuts, 0
        return n

    def held_from(self) -> int | None:
        inner = self._inner.held_from()
        mine = self._at_risk()
        if mine is None or (inner is not None and inner < mine):
            return inner
        return mine

    def _at_risk(self) -> int | None:
        """The first token the guard may still take back: the one that closed the last item
        of an open array one copy away from the guard."""
        if self._repeats > 1 and not self._dups:
            return None  # NOTE: the common case, checked on every step of a stream
        first: int | None = None
        for path, _ in self._tracker.open_values():
            if self._dups.get(path, 0) + 1 < self._repeats:
                continue
            items = self._tracker.items_of(path)
            if items:
                t = self._token_at(items[-1][1] - 1)
                first = t if first is None else min(first, t)
        return first

    # -- backend hooks ---------------------------------------------------------------------
    def _accept(self, token_id: int) -> bool:
        if not self._inner.accept_token(token_id):
            return False
        self._starts.append(len(self._tracker.text))
        if token_id in self._stops:
            closed = self._tracker.end()
        else:
            closed = self._tracker.feed(self._bytes[token_id] if token_id < len(self._bytes)
                                        else b"")
        closing = self._closing
        if closing is not None and any(c.path == closing.path for c in closed):
            self._closing = None
        for event in closed:
            if self._repeated(event):
                self._fire = self._token_at(event.siblings[-1][1] - 1)
                self._closing = _Closing(event.path[:-1], len(event.path), self._fire)
                break
        return True

    def _fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._inner.fill_bitmask(bitmask, row)
        closing = self._closing
        if closing is None or self._bitmask_np is None or len(self._starts) < closing.since:
            return
        depth, state = self._tracker.lexical_state()
        banned = self._table.banned(state, [closing.depth - depth, closing.depth + 1 - depth])
        if not len(banned):
            return
        words = self._bitmask_np[row].view(np.uint32)
        kept = words.copy()
        np.bitwise_and.at(words, banned >> 5,
                          ~(np.uint32(1) << (banned & 31).astype(np.uint32)))
        if not words.any():  # NOTE: e.g. minItems not met: the array goes on
            words[:] = kept

    def _forced(self) -> list[int]:
        return [] if self._closing is not None else self._inner.forced_tokens()

    def _rollback(self, n: int) -> None:
        self._inner.rollback(n)
        if self._inner.is_error():
            raise RuntimeError(self._inner.error())
        self._forget(n)

    def _backend_error(self) -> str | None:
        return self._inner.error()

    # -- the guard -------------------------------------------------------------------------
    def _forget(self, n: int) -> None:
        keep = max(len(self._starts) - n, 0)
        size = self._starts[keep] if keep < len(self._starts) else len(self._tracker.text)
        self._tracker.truncate(size)
        del self._starts[keep:]
        closing = self._closing
        if closing is not None and keep < closing.since:
            self._closing = None
        self._ids = {span: key for span, key in self._ids.items() if span[1] <= size}
        dups: dict[Path, int] = {}
        for path, _ in self._tracker.open_values():
            items = self._tracker.items_of(path)
            for i, (start, end) in enumerate(items or ()):
                if self._is_copy(start, end, items[:i]):  # type: ignore[index]
                    dups[path] = dups.get(path, 0) + 1
        self._dups = dups

    def _repeated(self, ev: Closed) -> bool:
        """Whether ``ev`` closes the ``repeats``-th copy of an earlier item of its array
        (not of an array the guard is closing already)."""
        if not (ev.siblings and ev.path and isinstance(ev.path[-1], int)):
            return False
        array = ev.path[:-1]
        if self._closing is not None and self._closing.path == array:
            return False
        if not self._is_copy(ev.start, ev.end, list(ev.siblings)):
            return False
        self._dups[array] = self._dups.get(array, 0) + 1
        return self._dups[array] >= self._repeats

    def _is_copy(self, start: int, end: int, before: list[tuple[int, int]]) -> bool:
        """Whether the container item at ``[start, end)`` equals one of ``before``."""
        if self._tracker.text[start] not in b"{[":
            return False
        mine = self._identity(start, end)
        return any(self._identity(s, e) == mine for s, e in before)

    def _identity(self, start: int, end: int) -> str:
        key = self._ids.get((start, end))
        if key is None:
            raw = bytes(self._tracker.text[start:end])
            key = self._ids[(start, end)] = identity(json.loads(raw))
        return key

    def _token_at(self, offset: int) -> int:
        """The accepted token that holds byte ``offset`` of the document."""
        lo, hi = 0, len(self._starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo
