"""JSON in the model's own style: candidate styles in lock-step until the output picks one.

A fixed separator style the model does not write (compact JSON after few-shot answers in
``json.dumps``' default style, say) pushes a small model off its habits, and it loops until
``max_tokens``. With ``json_style="auto"`` a grammar is compiled once per candidate style
(compact, spaced; see ``GrammarConfig``), and a :class:`StyleLockMatcher` runs their
matchers side by side:

- its mask is the union of the live candidates' masks, so the model picks the style;
- a sampled token drops the candidates that do not allow it; once one is left, the style is
  locked and the matcher is exactly that candidate (its keys and punctuation are forced, so
  jump-forward keeps its gain);
- forced tokens are the common prefix of the live candidates' forced spans (tokens every live
  style accepts), so jump-forward never decides the style for the model;
- ``rollback`` brings back candidates dropped at the positions undone.

The candidates part at the first key separator (``":"`` or ``": "``), so the extra masks cost
only the first few steps of a reply. A schema whose instances are never an object or an array
(:func:`separator_free`) has no separator: its styles are one language, compiled once.

A JSON schema's first requests need not wait for two builds: a :class:`StagedGrammar` serves
them from one llguidance grammar of both styles at once, narrowed token by token by a
``style_track.StyleTracker`` (the same language as the lock-step pair; what it gives up is
jump-forward across separators, where its grammar allows an optional space). When the schema
is reused, the per-style grammars are compiled in the background and take over, also in the
requests already running (:class:`StagedMatcher` replays their tokens).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np
import torch

from grammarserve.fsm.matcher import CompiledGrammar, Matcher, SharedMasks
from grammarserve.fsm.vocab import VocabInfo

_SCALARS = frozenset({"string", "number", "integer", "boolean", "null"})
#: Longer schema texts are not parsed for the test (scalar roots are small).
_SCALAR_TEXT_MAX = 4096


def separator_free(schema_text: str) -> bool:
    """Whether no instance of the JSON schema ``schema_text`` is an object or an array (its root
    ``type`` is scalar, or its ``enum``/``const`` values are): then no separator is ever
    written, and every JSON style is the same language. False when unsure."""
    if len(schema_text) > _SCALAR_TEXT_MAX:
        return False
    root = json.loads(schema_text)
    if not isinstance(root, dict):
        return False
    types = root.get("type")
    if isinstance(types, str):
        types = [types]
    if isinstance(types, list) and types and set(types) <= _SCALARS:
        return True
    values = root.get("enum", [root["const"]] if "const" in root else None)
    return isinstance(values, list) and bool(values) and not any(
        isinstance(v, (dict, list)) for v in values)


class StyleLockMatcher(Matcher):
    """Matchers of the same grammar in different JSON styles, run in lock-step until the
    output shows which style it uses."""

    def __init__(self, vocab: VocabInfo, candidates: list[Matcher],
                 shared: SharedMasks | None = None) -> None:
        super().__init__(vocab, shared)
        self._alive = list(range(len(candidates)))
        self._candidates = candidates
        self._dropped: list[tuple[int, int]] = []  # (position it was dropped at, index)
        # NOTE: row i holds candidate i's mask at ``_masks_pos`` (filled in place, no copies)
        self._rows = torch.empty((len(candidates), vocab.bitmask_width), dtype=torch.int32)
        self._rows_np = self._rows.numpy()
        self._masks: dict[int, np.ndarray] = {}  # candidate -> its row at ``_masks_pos``
        self._masks_pos = -1
        self._span: tuple[int, list[int]] = (-1, [])  # last common forced span and its start

    @property
    def styles_alive(self) -> int:
        """How many candidate styles the output so far is consistent with."""
        return len(self._alive)

    def _live(self) -> list[Matcher]:
        return [self._candidates[i] for i in self._alive]

    def draft_mark(self) -> tuple[object, ...]:
        return (self._span, tuple(m.draft_mark() for m in self._candidates))

    def draft_restore(self, mark: tuple[object, ...]) -> None:
        span, inner = mark
        self._span = span  # type: ignore[assignment]
        for m, sub in zip(self._candidates, inner):  # type: ignore[call-overload]
            m.draft_restore(sub)

    def _candidate_masks(self) -> dict[int, np.ndarray]:
        if self._masks_pos != self._pos:
            healthy = [i for i in self._alive if not self._candidates[i].is_error()]
            self._alive = healthy or self._alive  # an errored style is gone for good
            self._masks = {}
            for i in self._alive:
                self._candidates[i].fill_bitmask(self._rows, i)
                self._masks[i] = self._rows_np[i]
            self._masks_pos = self._pos
        return self._masks

    def _in_forced_span(self, token_id: int) -> bool:
        start, tokens = self._span
        k = self._pos - start
        return 0 <= k < len(tokens) and tokens[k] == token_id

    def _accept(self, token_id: int) -> bool:
        # NOTE: a token of the common forced span is allowed by every live style.
        if len(self._alive) > 1 and not self._in_forced_span(token_id):
            word, bit = divmod(token_id, 32)
            masks = self._candidate_masks()
            keep = [i for i in self._alive if (int(masks[i][word]) >> bit) & 1]
            if not keep:
                return False
            for i in self._alive:
                if i not in keep:
                    self._dropped.append((self._pos, i))
            self._alive = keep
        ok = [i for i in self._alive if self._candidates[i].accept_token(token_id)]
        if not ok:
            return False  # every style failed: their errors say why (_backend_error)
        self._alive = ok  # a backend failure: that style is gone for good
        return True

    def _fill(self, bitmask: torch.Tensor, row: int) -> None:
        if len(self._alive) == 1:
            self._candidates[self._alive[0]].fill_bitmask(bitmask, row)
            return
        masks = list(self._candidate_masks().values())
        target = self._bitmask_np[row] if self._bitmask_np is not None else None
        if target is None:  # pragma: no cover - the base class sets it before _fill
            target = bitmask[row].numpy()
        np.copyto(target, masks[0])
        for mask in masks[1:]:
            np.bitwise_or(target, mask, out=target)

    def _forced(self) -> list[int]:
        spans = [m.forced_tokens() for m in self._live()]
        common: list[int] = []
        for tokens in zip(*spans):
            if any(t != tokens[0] for t in tokens):
                break
            common.append(tokens[0])
        self._span = (self._pos, common)
        return common

    def _rollback(self, n: int) -> None:
        target = self._pos - n
        for m in self._live():
            m.rollback(n)
        while self._dropped and self._dropped[-1][0] >= target:
            at, i = self._dropped.pop()
            self._candidates[i].rollback(at - target)
            self._alive.append(i)
        self._alive.sort()
        self._masks_pos = -1
        self._span = (-1, [])

    def _backend_error(self) -> str | None:
        errors = [m.error() for m in self._live() if m.is_error()]
        return errors[0] if errors and len(errors) == len(self._alive) else None


class StyledGrammar(CompiledGrammar):
    """One grammar compiled in several JSON styles; its matchers lock to the model's style.

    Each style's grammar keeps its own backend, cache size and background upgrade.
    """

    def __init__(self, kind: str, styles: list[CompiledGrammar], vocab: VocabInfo,
                 compile_s: float) -> None:
        self.styles = styles
        self._vocab = vocab
        self._shared = shared = SharedMasks()
        super().__init__(backend=styles[0].backend, kind=kind,
                         make_matcher=lambda: StyleLockMatcher(
                             vocab, [g.matcher() for g in styles], shared),
                         size_bytes=lambda: (sum(g.size_bytes for g in styles)
                                             + shared.nbytes),
                         compile_s=compile_s)

    @property
    def backend(self) -> str:
        """The backend new matchers use (the first style's)."""
        return self.styles[0].backend

    def probe(self) -> Matcher:
        return StyleLockMatcher(self._vocab, [g.probe() for g in self.styles], self._shared)

    def request_upgrade(self) -> Future[bool] | None:
        """Start every style's planned upgrade; the future resolves when all are settled, to
        True if any style upgraded."""
        futures = [f for f in (g.request_upgrade() for g in self.styles) if f is not None]
        if not futures:
            return None
        if self.upgrade_future is None:
            self.upgrade_future = _all_settled(futures)
        return self.upgrade_future

    def set_upgrader(self, upgrader: Callable[[], Future[bool]]) -> None:
        raise TypeError("a StyledGrammar upgrades through its styles' grammars")


def _all_settled(futures: list[Future[bool]]) -> Future[bool]:
    done: Future[bool] = Future()
    results: list[bool] = []
    lock = threading.Lock()

    def settle(f: Future[bool]) -> None:
        with lock:
            # NOTE: a cancelled upgrade (its pool closed) is an abandoned one
            results.append(not f.cancelled() and f.exception() is None and bool(f.result()))
            if len(results) < len(futures):
                return
        done.set_result(any(results))

    for f in futures:
        f.add_done_callback(settle)
    return done


class StagedMatcher(Matcher):
    """A matcher of a :class:`StagedGrammar`: its grammar of both styles until the per-style
    grammars are ready, then theirs (the tokens so far replayed into it, which their shared
    language always takes), so a request that outlives the upgrade gets their jump-forward."""

    def __init__(self, vocab: VocabInfo, inner: Matcher, grammar: StagedGrammar,
                 shared: SharedMasks) -> None:
        super().__init__(vocab, shared)
        self._inner = inner
        self._grammar = grammar
        self._tokens: list[int] = []
        self._moved = False
        self._pending = 0  # forced tokens handed out and not yet accepted

    @property
    def moved(self) -> bool:
        """Whether the per-style grammars took over."""
        return isinstance(self._inner, StyleLockMatcher)

    def _move(self) -> None:
        # NOTE: only where a mask is computed, and never with forced tokens outstanding: the
        # grammars differ in which tokenizations of a forced span they allow (llguidance allows
        # the canonical one of the bytes it sees forced), so a mask, or forced tokens, from one
        # must be followed by the tokens that same matcher accepts.
        styled = self._grammar.styled
        if self._moved or styled is None or self._pending or self._inner.is_error() \
                or self._inner.is_terminated():
            return
        self._moved = True  # NOTE: tried once; a failed replay keeps the matcher it has
        other = styled.probe()
        for t in self._tokens:
            if not other.accept_token(t):
                return
        self._inner = other
        # NOTE: the staged grammar's masks of the first tokens are the other grammar's
        self._shared = SharedMasks()

    def draft_mark(self) -> tuple[object, ...]:
        return (self._pending, self._inner, self._inner.draft_mark())

    def draft_restore(self, mark: tuple[object, ...]) -> None:
        pending, inner, sub = mark
        self._pending = pending  # type: ignore[assignment]
        if inner is self._inner:  # NOTE: a move to the styled grammars during the draft stays
            self._inner.draft_restore(sub)  # type: ignore[arg-type]

    def _accept(self, token_id: int) -> bool:
        ok = self._inner.accept_token(token_id)
        if ok:
            self._tokens.append(token_id)
            self._pending = max(0, self._pending - 1)
        return ok

    def _fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._move()
        self._inner.fill_bitmask(bitmask, row)

    def _forced(self) -> list[int]:
        forced = self._inner.forced_tokens()
        self._pending = len(forced)
        return forced

    def _rollback(self, n: int) -> None:
        self._inner.rollback(n)
        del self._tokens[max(0, len(self._tokens) - n):]
        self._pending = 0

    def _backend_error(self) -> str | None:
        return self._inner.error() if self._inner.is_error() else None


class StagedGrammar(CompiledGrammar):
    """A JSON schema's grammar of both styles at once (one build, for its first requests),
    replaced by its :class:`StyledGrammar` once that is compiled (on reuse, in the
    background; ``policy.py``); the matchers made before move over too."""

    def __init__(self, either: CompiledGrammar, vocab: VocabInfo) -> None:
        self.styled: StyledGrammar | None = None
        shared = SharedMasks()
        super().__init__(backend=either.backend, kind=either.kind,
                         make_matcher=lambda: StagedMatcher(vocab, either.probe(), self,
                                                            shared),
                         size_bytes=lambda: either.size_bytes + shared.nbytes,
                         compile_s=either.compile_s)

    @property
    def backend(self) -> str:
        """The backend new matchers use (the styled grammar's, once it took over)."""
        return self.styled.backend if self.styled is not None else self._backend

    def upgrade(self, other: CompiledGrammar) -> None:
        if isinstance(other, StyledGrammar):
            self.styled = other
        super().upgrade(other)


def then_settled(first: Future[CompiledGrammar | None],
                 after: Callable[[CompiledGrammar], Future[bool] | bool]) -> Future[bool]:
    """A future that settles once ``first`` gave a grammar and ``after(grammar)`` did (it
    returns a result, or a future of one); False if ``first`` failed, was cancelled (a closed
    pool) or gave None."""
    done: Future[bool] = Future()

    def step(f: Future[CompiledGrammar | None]) -> None:
        grammar = None if f.cancelled() or f.exception() is not None else f.result()
        if grammar is None:
            done.set_result(False)
            return
        nxt = after(grammar)
        if isinstance(nxt, bool):
            done.set_result(nxt)
        else:
            nxt.add_done_callback(lambda f: done.set_result(
                not f.cancelled() and f.exception() is None and bool(f.result())))

    first.add_done_callback(step)
    return done
