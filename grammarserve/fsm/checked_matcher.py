"""Run-time value checks around a grammar's matchers (the keywords no grammar can hold, see
``schema/checks/split.py``): a :class:`CheckedMatcher` follows the generated JSON (``json_track.py``) and,
when a value at a checked location closes, validates it (``jsonschema_rs`` when installed, else
``jsonschema``). ``uniqueItems`` compares each item with the earlier ones as it closes.

On failure the matcher rolls back to where the failed attempt began: the value's first token
(for a string or container, the first that holds more than its opening quote or bracket:
``, "`` only starts an item, ``apple`` is the attempt), or the first token after it that was
not forced (a forced token has no alternative), or, for ``contains`` with too few matches, the
token that closed the array, or the item one too many for ``maxContains``. That token is banned
at that position (if that leaves the grammar nothing, the ban goes to the free tokens before it,
nearest first), and decoding continues; the caller
learns how many tokens to drop from :meth:`CheckedMatcher.take_retraction`. After
``max_retries`` retries, or when the ban leaves no token, the matcher enters the error state
with a message: a reply is never an invalid success.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from grammarserve.fsm.check_set import CheckSet
from grammarserve.fsm.json_track import Closed, JsonTracker, Path
from grammarserve.fsm.matcher import CompiledGrammar, Matcher, SharedMasks
from grammarserve.fsm.value_check import ValueCheck, identity
from grammarserve.fsm.vocab import VocabInfo

#: Tokens before the failed attempt a retry may go back to when a ban leaves nothing.
MAX_BACKOFF = 16


@dataclass(frozen=True)
class _Failure:
    offset: int  # byte offset in the document where the failed attempt began
    message: str


class CheckedMatcher(Matcher):
    """A matcher of a grammar plus its value checks (see the module docstring)."""
    retracts = True

    def __init__(self, vocab: VocabInfo, inner: Matcher, checks: CheckSet) -> None:
        uncached = SharedMasks()
        uncached.MAX_ENTRIES = 0  # NOTE: bans change masks; the inner matcher still caches
        super().__init__(vocab, uncached)
        self._inner = inner
        self._set = checks
        self._tracker = JsonTracker()
        self._tokens: list[int] = []
        self._starts: list[int] = []  # byte offset of each accepted token in the document
        self._was_forced: list[bool] = []
        self._expect: tuple[int, list[int]] = (-1, [])  # the last forced span and its position
        self._bans: dict[int, set[int]] = {}  # position -> tokens banned there
        self._failure: _Failure | None = None
        self._retracted = 0
        self._dead: str | None = None
        self._identities: dict[bytes, str] = {}
        self._last = ""  # the last check failure's message
        self._scratch: torch.Tensor | None = None  # one mask row, for the retry decision
        self.retries = 0
        self.exhausted = False  # failed for good: retries used up, or nothing left to try

    @property
    def value_checks(self) -> tuple[ValueCheck, ...]:
        return self._set.checks

    # -- public additions ------------------------------------------------------------------
    def accept_token(self, token_id: int) -> bool:
        """As :meth:`Matcher.accept_token`; a token that closes a value failing its check is
        accepted and then rolled back (see :meth:`take_retraction`); False once the retries
        are used up (error state)."""
        if not super().accept_token(token_id):
            return False
        failure, self._failure = self._failure, None
        return failure is None or self._retry(failure)

    def accept_draft(self, token_id: int) -> bool:
        """As :meth:`Matcher.accept_draft`: a token closing a value that fails its check is
        refused (taken back at once, no retry, no ban)."""
        if not Matcher.accept_token(self, token_id):
            return False
        if self._failure is None:
            return True
        self._failure = None
        self.rollback(1)
        return False

    def draft_mark(self) -> tuple[object, ...]:
        return (self._expect, self._inner.draft_mark())

    def draft_restore(self, mark: tuple[object, ...]) -> None:
        expect, inner = mark
        self._expect = expect  # type: ignore[assignment]
        self._inner.draft_restore(inner)  # type: ignore[arg-type]

    def take_retraction(self) -> int:
        n, self._retracted = self._retracted, 0
        return n

    def held_from(self) -> int | None:
        opened = self._tracker.open_values()
        if not opened:
            return None
        # NOTE: a retry may back off to up to MAX_BACKOFF free tokens before the value that
        # failed (``_retry_tokens``), and that value may not have opened yet (the whitespace
        # before an item, in the flexible style): those tokens are held too
        held = self._free_before(len(self._tokens))
        starts = [s for path, s in opened if self._set.holds(path)]
        if starts:
            first = max(bisect_right(self._starts, min(starts)) - 1, 0)
            held = min(held, first, self._free_before(first))
        return held

    def _free_before(self, end: int) -> int:
        """The earliest of the last ``MAX_BACKOFF`` free tokens before ``end`` (or ``end``)."""
        found, at = 0, end
        for i in range(end - 1, -1, -1):
            if not self._was_forced[i]:
                found, at = found + 1, i
                if found == MAX_BACKOFF:
                    break
        return at

    # -- backend hooks ---------------------------------------------------------------------
    def _accept(self, token_id: int) -> bool:
        if not self._inner.accept_token(token_id):
            return False
        pos = len(self._tokens)
        at, span = self._expect
        self._was_forced.append(0 <= pos - at < len(span) and span[pos - at] == token_id)
        self._tokens.append(token_id)
        self._starts.append(len(self._tracker.text))
        if token_id in self._stops:
            closed = self._tracker.end()
        else:
            data = self._set.token_bytes[token_id] if token_id < len(self._set.token_bytes) \
                else b""
            closed = self._tracker.feed(data)
        self._failure = self._first_failure(closed) if closed else None
        return True

    def _fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._inner.fill_bitmask(bitmask, row)
        bans = self._bans.get(len(self._tokens))
        if not bans or self._bitmask_np is None:
            return
        words = self._bitmask_np[row].view(np.uint32)
        for t in bans:
            words[t >> 5] &= np.uint32(~(1 << (t & 31)) & 0xFFFFFFFF)
        if not words.any():
            self.exhausted = True
            self._dead = (f"value check failed ({self._last}) and the grammar allows no other "
                          "token where the failed value began")

    def _forced(self) -> list[int]:
        span = self._inner.forced_tokens()
        if span and span[0] in self._bans.get(len(self._tokens), ()):
            return []
        self._expect = (len(self._tokens), list(span))
        return span

    def _rollback(self, n: int) -> None:
        self._inner.rollback(n)
        if self._inner.is_error():
            raise RuntimeError(self._inner.error())
        keep = max(len(self._tokens) - n, 0)
        self._tracker.truncate(self._starts[keep] if keep < len(self._starts)
                               else len(self._tracker.text))
        del self._tokens[keep:], self._starts[keep:], self._was_forced[keep:]
        for p in [p for p in self._bans if p > keep]:
            del self._bans[p]
        self._expect = (-1, [])

    def _backend_error(self) -> str | None:
        return self._inner.error() or self._dead

    # -- checks ----------------------------------------------------------------------------
    def _retry(self, failure: _Failure) -> bool:
        self._last = failure.message
        if self.retries >= self._set.max_retries:
            self.exhausted = True
            self._error = (f"value check failed after {self.retries} retries: "
                           f"{failure.message}")
            return False
        self.retries += 1
        history, total = list(self._tokens), len(self._tokens)
        for t in self._retry_tokens(failure.offset):
            self.rollback(len(self._tokens) - t)
            if self._error is not None:
                return False
            self._bans.setdefault(t, set()).add(history[t])
            if self._allows_a_token():
                self._retracted += total - t
                return True
        self.exhausted = True
        self._error = (f"value check failed ({failure.message}) and no token before it has "
                       "another choice")
        return False

    def _retry_tokens(self, offset: int) -> list[int]:
        """Where to retry, best first: the token that began the failed attempt at ``offset``
        (the first from the token holding that byte on that was not forced and, for a string
        or container, holds more than its opening quote or bracket: ``, "`` only starts an
        item, the attempt is the content after it), then the free tokens before it, nearest
        first (when a ban leaves the grammar nothing, the choice was made earlier)."""
        first = max(bisect_right(self._starts, offset) - 1, 0)
        text = self._tracker.text
        opener = offset < len(text) and text[offset] in b'"[{'
        free = [i for i in range(len(self._tokens)) if not self._was_forced[i]]
        start = next((i for i in free if i >= first and (not opener or (
            self._starts[i + 1] if i + 1 < len(self._starts) else len(text)) > offset + 1)),
            None)
        if start is None:
            start = next((i for i in free if i >= first), first)
        before = [i for i in reversed(free) if i < start][:MAX_BACKOFF]
        return [start] + before

    def _allows_a_token(self) -> bool:
        """Whether the grammar allows a token here besides the banned ones."""
        if self._scratch is None:
            self._scratch = torch.zeros((1, self._vocab.bitmask_width), dtype=torch.int32)
        self._inner.fill_bitmask(self._scratch, 0)
        words = self._scratch.numpy()[0].view(np.uint32)
        for t in self._bans.get(len(self._tokens), ()):
            words[t >> 5] &= np.uint32(~(1 << (t & 31)) & 0xFFFFFFFF)
        return bool(words.any())

    def _first_failure(self, closed: list[Closed]) -> _Failure | None:
        for event in closed:
            for check in self._set.candidates(event.path):
                failure = self._run(check, event)
                if failure is not None:
                    return failure
        return None

    def _run(self, check: ValueCheck, ev: Closed) -> _Failure | None:
        path = ev.path
        if check.kind == "unique":
            if not (path and isinstance(path[-1], int) and check.matches(path[:-1])):
                return None
            mine = self._identity(ev.start, ev.end)
            if any(self._identity(s, e) == mine for s, e in ev.siblings):
                return _Failure(ev.start, f"item {_pointer(path)} repeats an earlier item "
                                f"('uniqueItems' at {check.schema_path})")
            return None
        if not check.matches(path):
            return None
        value = self._value(ev.start, ev.end)
        error = self._set.validator(check.schema)(value)
        if error is None:
            return None
        offset = ev.start
        if check.kind == "contains" and isinstance(value, list):
            offset = self._contains_retry(check, ev, value)
        return _Failure(offset, f"the value at {_pointer(path)} fails '{check.keyword}' at "
                        f"{check.schema_path}: {error}")

    def _contains_retry(self, check: ValueCheck, ev: Closed, value: list[Any]) -> int:
        """Too few matches: retry at the closing bracket; too many: at the item too many."""
        rule = json.loads(check.schema)["allOf"][0]
        counts = self._set.validator(check.item_schema)
        matching = [i for i, item in enumerate(value) if counts(item) is None]
        most = rule.get("maxContains")
        if most is not None and len(matching) > most and len(ev.items) == len(value):
            return ev.items[matching[most]][0]
        return ev.end - 1

    def _value(self, start: int, end: int) -> Any:
        return json.loads(bytes(self._tracker.text[start:end]))

    def _identity(self, start: int, end: int) -> str:
        raw = bytes(self._tracker.text[start:end])
        key = self._identities.get(raw)
        if key is None:
            key = self._identities[raw] = identity(json.loads(raw))
        return key


def _pointer(path: Path) -> str:
    return "/" + "/".join(str(p) for p in path)


class CheckedGrammar(CompiledGrammar):
    """A compiled grammar plus the value checks its matchers run (``value_checks``); the
    inner grammar keeps its backend, cache size and background upgrade."""

    def __init__(self, inner: CompiledGrammar, checks: CheckSet, vocab: VocabInfo) -> None:
        self.inner = inner
        self.check_set = checks
        super().__init__(backend=inner.backend, kind=inner.kind,
                         make_matcher=lambda: CheckedMatcher(vocab, inner.matcher(), checks),
                         size_bytes=lambda: inner.size_bytes, compile_s=inner.compile_s)

    @property
    def value_checks(self) -> tuple[ValueCheck, ...]:
        return self.check_set.checks

    @property
    def backend(self) -> str:
        return self.inner.backend

    @property  # type: ignore[override]
    def upgrade_future(self) -> Future[bool] | None:
        return self.inner.upgrade_future

    @upgrade_future.setter
    def upgrade_future(self, value: Future[bool] | None) -> None:
        pass  # NOTE: the inner grammar owns it (CompiledGrammar.__init__ sets None)

    def request_upgrade(self) -> Future[bool] | None:
        return self.inner.request_upgrade()

    def set_upgrader(self, upgrader: Callable[[], Future[bool]]) -> None:
        self.inner.set_upgrader(upgrader)

    def upgrade(self, other: CompiledGrammar) -> None:
        self.inner.upgrade(other)

