"""The reasoning span before a constraint: :class:`ReasoningMatcher` wraps any matcher (or none).

A reasoning model writes free text (``<think>`` ... ``</think>``, see ``reasoning_formats.py``)
before its answer; the request's constraint (a JSON schema with its value checks and loop guard,
a regex, a grammar, a choice, tool calls: whatever matcher) applies to the answer only. The
wrapper runs in phases (``ReasoningSpan`` says what to force):

1. the opening (``span.open``), forced when the prompt did not open the span;
2. the span: any token, except one that would complete the end marker and go on past it (the
   answer starts on a token boundary), a stop token (a constrained reply, or ``strict``), and
   under ``strict`` a token that completes a banned marker (a tool-call trigger);
   after ``span.budget`` span tokens, ``span.close`` is forced (jump-forward tokens);
3. ``span.after`` (the family's whitespace or header after the end marker), forced;
4. the answer: every call goes to the inner matcher (its positions count from here), or any
   token when there is none (an unconstrained reply with a budget or strict thinking).

Markers are tracked over the tokens' bytes with one KMP automaton each; per marker and
automaton state, which tokens complete it (at their end, or before it) is computed once per
engine (:class:`ReasoningTables`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from grammarserve.constraints import ReasoningSpan
from grammarserve.fsm.kmp import Kmp
from grammarserve.fsm.matcher import Matcher, SharedMasks
from grammarserve.fsm.vocab import VocabInfo

_FORCE, _SPAN, _ANSWER = range(3)


class MarkerTable:
    """One marker over a vocabulary: from each KMP state (bytes of the marker matched at the
    end of the text), the tokens that complete it exactly at their end (``exact``) and those
    that complete it and go on (``past``)."""

    def __init__(self, marker: bytes, token_bytes: Sequence[bytes]) -> None:
        self.marker = marker
        self._kmp = Kmp(marker)
        exact: list[list[int]] = [[] for _ in marker]
        past: list[list[int]] = [[] for _ in marker]
        last = marker[-1:]
        for t, data in enumerate(token_bytes):
            if not data or last not in data:  # NOTE: a completion ends inside the token
                continue
            for k in range(len(marker)):
                text = marker[:k] + data
                i = text.find(marker)
                if i >= 0:
                    (exact if i + len(marker) == len(text) else past)[k].append(t)
        self.exact = [np.array(ids, dtype=np.int64) for ids in exact]
        self.past = [np.array(ids, dtype=np.int64) for ids in past]

    def step(self, k: int, data: bytes) -> tuple[int, int | None]:
        """The state after ``data`` from state ``k``, and where in ``data`` the marker first
        completed (the offset just past it), or None."""
        return self._kmp.step(k, data)


class ReasoningTables:
    """The marker tables and forced-text tokenizations of one engine's vocabulary (built on
    first use, kept). Special tokens count as their text here (gpt-oss's ``<|end|>`` is one)."""

    def __init__(self, tokenizer: Any, token_bytes: Sequence[bytes]) -> None:
        self.tokenizer = tokenizer
        data = list(token_bytes)
        for i, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
            if 0 <= i < len(data) and not data[i]:
                data[i] = str(getattr(added, "content", "")).encode("utf-8")
        self.token_bytes = data
        self._markers: dict[str, MarkerTable] = {}
        self._texts: dict[str, tuple[int, ...]] = {}

    def marker(self, text: str) -> MarkerTable:
        table = self._markers.get(text)
        if table is None:
            table = self._markers[text] = MarkerTable(text.encode("utf-8"), self.token_bytes)
        return table

    def encode(self, text: str) -> tuple[int, ...]:
        """The tokens ``text`` is forced as."""
        ids = self._texts.get(text)
        if ids is None:
            ids = self._texts[text] = tuple(
                self.tokenizer.encode(text, add_special_tokens=False)) if text else ()
        return ids


@dataclass(frozen=True)
class _State:
    phase: int
    forced: tuple[int, ...] = ()  # _FORCE: the tokens still to force
    then: int = _ANSWER  # _FORCE: the phase after them
    end_k: int = 0  # _SPAN: the end marker's automaton state
    ban_k: tuple[int, ...] = ()  # _SPAN: the banned markers' states
    spent: int = 0  # span tokens written
    answer: int = 0  # tokens the inner matcher accepted


class ReasoningMatcher(Matcher):
    """A reasoning span, then ``inner`` (see the module docstring)."""

    def __init__(self, vocab: VocabInfo, inner: Matcher | None, span: ReasoningSpan,
                 tables: ReasoningTables) -> None:
        # NOTE: the wrapper's masks depend on more than the first tokens: not shared
        uncached = SharedMasks()
        uncached.MAX_ENTRIES = 0
        super().__init__(vocab, uncached)
        self.inner = inner
        self.retracts = inner.retracts if inner is not None else False
        self._span = span
        self._bytes = tables.token_bytes
        self._end = tables.marker(span.end)
        self._bans = tuple(tables.marker(b) for b in span.banned) if span.strict else ()
        self._ban_stops = span.strict or inner is not None
        self._stop_ids = np.array(sorted(self._stops), dtype=np.int64)
        self._close = tables.encode(span.close or span.end)
        self._after = tables.encode(span.after)
        self._history: list[_State] = []
        self._retracted = 0
        opening = tables.encode(span.open)
        first = self._in_span(0, 0, None)
        if opening and first.phase == _FORCE:  # NOTE: a zero budget: open and close at once
            first = replace(first, forced=opening + first.forced)
        elif opening:
            first = _State(_FORCE, opening, _SPAN)
        self._state = first

    # -- what the engine asks besides the Matcher API ----------------------------------------
    @property
    def exhausted(self) -> bool:  # type: ignore[override]
        return self.inner.exhausted if self.inner is not None else False

    @property
    def forcing(self) -> bool:
        """Whether the next tokens are forced (the opening, the close, what follows it)."""
        return self._state.phase == _FORCE

    @property
    def in_answer(self) -> bool:
        """Whether the span is over (the inner matcher has the reply from here)."""
        return self._state.phase == _ANSWER

    @property
    def span_tokens(self) -> int:
        """Tokens written inside the span so far (forced ones excluded)."""
        return self._state.spent

    def accept_token(self, token_id: int) -> bool:
        if not super().accept_token(token_id):
            return False
        if self.inner is not None and self._state.phase == _ANSWER:
            back = self.inner.take_retraction()
            if back:  # the inner matcher took its own tokens back already
                self._restore(back)
                self._retracted += back
        return True

    def accept_draft(self, token_id: int) -> bool:
        """As :meth:`Matcher.accept_draft`: in the answer, refused where the inner matcher
        would take tokens back."""
        inner = self.inner
        if inner is not None and inner.retracts and self._state.phase == _ANSWER:
            if not inner.accept_draft(token_id):
                return False
            inner.rollback(1)  # NOTE: checked alone first; now through the wrapper's state
        return self.accept_token(token_id)

    def draft_mark(self) -> tuple[object, ...]:
        return self.inner.draft_mark() if self.inner is not None else ()

    def draft_restore(self, mark: tuple[object, ...]) -> None:
        if self.inner is not None:
            self.inner.draft_restore(mark)

    def take_retraction(self) -> int:
        n, self._retracted = self._retracted, 0
        return n

    def held_from(self) -> int | None:
        first = self.inner.held_from() if self.inner is not None else None
        if first is None:
            return None
        return len(self._history) - self._state.answer + first

    # -- the phases ---------------------------------------------------------------------------
    def _in_span(self, spent: int, end_k: int, ban_k: tuple[int, ...] | None) -> _State:
        budget = self._span.budget
        if budget is not None and spent >= budget:
            return self._forcing(self._close + self._after, spent)
        return _State(_SPAN, end_k=end_k, ban_k=ban_k if ban_k is not None else
                      tuple(0 for _ in self._bans), spent=spent)

    def _forcing(self, tokens: tuple[int, ...], spent: int) -> _State:
        return _State(_FORCE, tokens, _ANSWER, spent=spent) if tokens else _State(
            _ANSWER, spent=spent)

    def _accept(self, token_id: int) -> bool:
        s = self._state
        if s.phase == _FORCE:
            if token_id != s.forced[0]:
                return False
            rest = s.forced[1:]
            if rest:
                new = replace(s, forced=rest)
            elif s.then == _SPAN:
                new = self._in_span(s.spent, 0, None)
            else:
                new = _State(_ANSWER, spent=s.spent)
        elif s.phase == _SPAN:
            if token_id in self._stops:
                if self._ban_stops:
                    return False
                new = s
            else:
                data = self._bytes[token_id] if token_id < len(self._bytes) else b""
                end_k, done = self._end.step(s.end_k, data)
                if done is not None and done < len(data):
                    return False
                ban_k = []
                for table, k in zip(self._bans, s.ban_k):
                    k, hit = table.step(k, data)
                    if hit is not None:
                        return False
                    ban_k.append(k)
                new = (self._forcing(self._after, s.spent + 1) if done is not None
                       else self._in_span(s.spent + 1, end_k, tuple(ban_k)))
        else:
            if self.inner is not None and not self.inner.accept_token(token_id):
                return False
            new = replace(s, answer=s.answer + 1)
        self._history.append(s)
        self._state = new
        return True

    def _fill(self, bitmask: torch.Tensor, row: int) -> None:
        s = self._state
        if s.phase == _ANSWER and self.inner is not None:
            self.inner.fill_bitmask(bitmask, row)
            return
        assert self._bitmask_np is not None  # NOTE: checked by fill_bitmask before _fill
        words = self._bitmask_np[row].view(np.uint32)
        if s.phase == _FORCE:
            words[:] = 0
            word, bit = divmod(s.forced[0], 32)
            words[word] = np.uint32(1 << bit)
            return
        words[:] = np.uint32(0xFFFFFFFF)
        if s.phase == _ANSWER:
            return
        _clear(words, self._end.past[s.end_k])
        for table, k in zip(self._bans, s.ban_k):
            _clear(words, table.exact[k])
            _clear(words, table.past[k])
        if self._ban_stops:
            _clear(words, self._stop_ids)

    def _forced(self) -> list[int]:
        s = self._state
        if s.phase == _FORCE:
            return list(s.forced)
        if s.phase == _ANSWER and self.inner is not None:
            return self.inner.forced_tokens()
        return []

    def _rollback(self, n: int) -> None:
        back = self._restore(n)
        if back and self.inner is not None:
            self.inner.rollback(back)
            if self.inner.is_error():
                raise RuntimeError(self.inner.error())

    def _restore(self, n: int) -> int:
        """Go back ``n`` tokens in the wrapper's own state; how many of them were the inner
        matcher's."""
        n = min(n, len(self._history))
        if n == 0:
            return 0
        target = self._history[-n]
        back = self._state.answer - target.answer
        del self._history[-n:]
        self._state = target
        return back

    def _backend_error(self) -> str | None:
        return self.inner.error() if self.inner is not None else None


def _clear(words: np.ndarray, ids: np.ndarray) -> None:
    if len(ids):
        np.bitwise_and.at(words, ids >> 5, ~(np.uint32(1) << (ids & 31).astype(np.uint32)))
