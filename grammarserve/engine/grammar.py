"""Constrained requests inside the engine: compile their grammars without blocking the batch,
fill the step's token bitmask (on a worker thread, while the model forward runs), and advance
matchers by sampled and jump-forward tokens.

Each operation on one request's matcher (mask fill, accept, value check, jump-forward) is
confined to that request: if its matcher raises, the request fails alone with
``CONSTRAINT_INVALID`` (its constraint could not be enforced, a 400) and the step goes on."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from grammarserve.config import EngineConfig
from grammarserve.constraints import ConstraintKind
from grammarserve.engine.bitmask_ring import BitmaskRing
from grammarserve.engine.request import Req
from grammarserve.errors import ErrorKind, GrammarError
from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.canonical import CanonicalSpans
from grammarserve.fsm.loop_guard import CommaTable, LoopGuardMatcher
from grammarserve.fsm.matcher import Matcher
from grammarserve.fsm.pools import BackgroundPool, settled
from grammarserve.fsm.reasoning import ReasoningMatcher, ReasoningTables

log = logging.getLogger(__name__)
#: A filled bitmask and the requests whose row could not be filled (with why)
Filled = tuple[torch.Tensor, list[tuple[Req, Exception]]]


@dataclass
class GrammarCounters:
    constrained_requests: int = 0
    grammar_errors: int = 0
    jump_forward_tokens: int = 0
    check_retries: int = 0  # value checks that failed and were retried (rolled back)
    loop_guard_cuts: int = 0  # array items the loop guard took back (copies of earlier ones)
    check_failures: int = 0  # requests ended because their value checks kept failing
    mask_fill_s: float = 0.0
    mask_wait_s: float = 0.0  # time the step waited for the bitmask after the forward


class GrammarRunner:
    """Owns the grammar compiler, the step bitmask and the fill worker of one engine."""

    def __init__(self, tokenizer: Any, config: EngineConfig, *, vocab_size: int,
                 stop_token_ids: list[int]) -> None:
        self.jump_forward = config.enable_jump_forward
        self.json_spans = config.json_schema_spans
        self.loop_guard = config.loop_guard
        self.spans = CanonicalSpans(tokenizer) if config.canonical_spans else None
        self.compiler = GrammarCompiler(tokenizer, **config.grammar_options,
                                        vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        # NOTE: a row per request and draft position; the last row of each buffer is scratch
        # space for the end-of-grammar check in ``forced`` (never copied). On CPU one bitmask
        # object for every fill (matchers validate a bitmask once per object); on CUDA pinned
        # buffers in rotation, so a fill never overwrites one whose copy is in flight.
        rows = config.max_num_reqs * (1 + config.num_speculative_tokens) + 1
        self._ring = BitmaskRing(lambda: self.compiler.allocate_bitmask(rows),
                                 config.torch_device)
        stops = sorted(self.compiler.stop_token_ids)
        self._stop_words = np.array([t // 32 for t in stops], dtype=np.int64)
        self._stop_bits = np.array([1 << (t % 32) for t in stops], dtype=np.uint32)
        self._stops = stops
        self._stop_set = frozenset(stops)
        self._worker = BackgroundPool(1, "grammar-mask")
        self.counters = GrammarCounters()
        self._commas: CommaTable | None = None  # the loop guard's, built on first use
        self._reasoning: ReasoningTables | None = None  # reasoning markers, built on first use

    @property
    def _bitmask(self) -> torch.Tensor:
        """The host bitmask the step being built fills (the ring's current buffer)."""
        return self._ring.current

    @property
    def _words(self) -> np.ndarray:
        return self._ring.words

    @property
    def bitmask_ring(self) -> BitmaskRing:
        """The step bitmask's host buffers (their depth, pinning and ``stats``: sends, and how
        often reusing a buffer had to wait for its copy)."""
        return self._ring

    def warm_up(self) -> None:
        """Build the grammar backends' tokenizer tables and the loop guard's table now rather
        than for the first constrained request."""
        self.compiler.warmup()
        if self.loop_guard:
            self._comma_table()

    def _comma_table(self) -> CommaTable:
        if self._commas is None:
            self._commas = CommaTable(self.compiler.token_bytes())
        return self._commas

    def start_compile(self, req: Req) -> None:
        """Begin compiling ``req``'s constraint (cache hits complete at once)."""
        constraint = req.params.constraint
        assert constraint is not None
        if constraint.prepared is not None:  # NOTE: the front end ran in the caller's process
            req.grammar_future = self.compiler.compile_prepared_async(constraint.prepared)
        else:
            kind, args, kwargs = constraint.compile_args()
            req.grammar_future = self.compiler.compile_async(kind, *args, **kwargs)
        self.counters.constrained_requests += 1

    def abandon(self, req: Req) -> None:
        """``req`` left mid-compile: a compile no request waits for is dropped."""
        if req.grammar_future is not None:
            self.compiler.cache.abandon(req.grammar_future)

    @staticmethod
    def compiling(reqs: list[Req]) -> bool:
        """Whether a compile of one of ``reqs`` is still running."""
        return any(r.grammar_future is not None and not r.grammar_future.done() for r in reqs)

    def finish_compile(self, req: Req) -> bool:
        """If ``req``'s compile is done, give it a matcher (True) or an error (True, with
        ``req.error`` set); False while still compiling."""
        fut = req.grammar_future
        if fut is None or not fut.done():
            return False
        req.grammar_future = None
        try:
            req.matcher = self._reasoned(req, self._guarded(req, fut.result().matcher()))
        except GrammarError as e:
            req.fail(ErrorKind.CONSTRAINT_INVALID, f"invalid constraint: {e}", (str(e), e.path))
            self.counters.grammar_errors += 1
        except Exception as e:  # noqa: BLE001 - a backend bug must only fail this request
            req.fail(ErrorKind.ENGINE_FAILURE, f"the constraint could not be compiled: {e}")
            self.counters.grammar_errors += 1
        return True

    def _guarded(self, req: Req, matcher: Matcher) -> Matcher:
        """``matcher``, wrapped in the array loop guard when the engine has it on
        (``EngineConfig.loop_guard``) and the whole reply is JSON (a JSON schema, or tool calls
        as one JSON array)."""
        c = req.params.constraint
        json_out = c is not None and (c.kind is ConstraintKind.JSON_SCHEMA or (
            c.kind is ConstraintKind.TOOL_CALLS and c.tool_format == "json_array"))
        if not self.loop_guard or not json_out:
            return matcher
        table = self._comma_table()
        return LoopGuardMatcher(matcher.vocab, matcher, table, self.loop_guard)

    def reasoning_only(self, req: Req) -> Matcher:
        """The matcher of an unconstrained request with a reasoning span to enforce (its
        thinking budget, or strict thinking)."""
        return self._reasoned(req, None)

    def _reasoned(self, req: Req, inner: Matcher | None) -> Matcher:
        """``inner`` behind the request's reasoning span, if it has one."""
        span = req.params.reasoning
        if span is None:
            assert inner is not None
            return inner
        if self._reasoning is None:
            self._reasoning = ReasoningTables(self.compiler.vocab.tokenizer,
                                              self.compiler.token_bytes())
        return ReasoningMatcher(self.compiler.vocab, inner, span, self._reasoning)

    def forced_draft(self, req: Req) -> list[int]:
        """The span ``req``'s grammar forces next (in the tokenizer's own tokenization, as
        jump-forward would feed it), for a speculative draft: where jump-forward does not feed
        it (a JSON schema's key names, by default), the model may still spell it that way.
        The matcher is left as it was; [] on any failure (a draft is only a guess)."""
        m = req.matcher
        if m is None or m.is_error() or m.is_terminated():
            return []
        try:
            mark = m.draft_mark()
            span = m.forced_tokens()
            m.draft_restore(mark)
            marker = isinstance(m, ReasoningMatcher) and m.forcing
            if self.spans is not None and span and not marker:
                span = self.spans.canonical(req.output_ids, span)
        except Exception:  # noqa: BLE001 - never fail a request over a draft
            return []
        return [t for t in span if t not in self._stop_set]

    def check_draft(self, req: Req, row: int) -> None:
        """Cut ``req.draft`` at its first token that ``req``'s matcher refuses (its mask does
        not allow it, or a value check or the loop guard would take it back: see
        ``Matcher.accept_draft``), and fill bitmask rows ``row ..`` with the masks after each
        prefix of what is kept, the whole draft's included (``len(req.draft) + 1`` rows); the
        matcher is left as it was. If the matcher fails, the request fails alone and its
        draft is dropped."""
        m = req.matcher
        assert m is not None
        kept = 0
        bitmask, words = self._bitmask, self._words
        try:
            mark = m.draft_mark()
            for tok in req.draft:
                m.fill_bitmask(bitmask, row + kept)
                if not words[row + kept, tok >> 5] >> (tok & 31) & 1 or \
                        not m.accept_draft(tok):
                    break
                kept += 1
            else:
                m.fill_bitmask(bitmask, row + kept)
            m.rollback(kept)
            m.draft_restore(mark)
            if m.is_error():
                raise RuntimeError(m.error())
        except Exception as e:  # noqa: BLE001 - fails its request only
            self._broken(req, "checking a speculative draft", e)
            kept = 0
        del req.draft[kept:]

    def fill_async(self, reqs: list[Req]) -> Future[Filled | None]:
        """Fill the bitmask rows of ``reqs`` (in order, ``1 + len(req.draft)`` rows each; a
        constrained request's draft rows were filled by :meth:`check_draft`) on the worker
        thread.
        Resolves to None when none of them is constrained."""
        if not any(r.matcher is not None for r in reqs):
            return settled(None)
        queued: Future[Filled | None] | None = self._worker.submit(
            self._fill, list(reqs), self._bitmask)
        # NOTE: after shutdown (or at interpreter exit) the fill runs on this thread
        return queued if queued is not None else settled(self._fill(list(reqs), self._bitmask))

    def _fill(self, reqs: list[Req], buffer: torch.Tensor) -> Filled:
        t0 = time.perf_counter()
        bitmask = buffer[:sum(1 + len(r.draft) for r in reqs)]
        failed: list[tuple[Req, Exception]] = []
        row = 0
        for req in reqs:
            first, row = row, row + 1 + len(req.draft)
            if req.matcher is None or req.error is not None:
                bitmask[first:row].fill_(-1)
                continue
            if req.draft:  # NOTE: its rows were filled by check_draft before the forward
                continue
            try:
                req.matcher.fill_bitmask(buffer, first)
            except Exception as e:  # noqa: BLE001 - fails its request (in ``wait``) only
                bitmask[first].fill_(-1)
                failed.append((req, e))
        self.counters.mask_fill_s += time.perf_counter() - t0
        return bitmask, failed

    def wait(self, fut: Future[Filled | None]) -> torch.Tensor | None:
        """The filled bitmask, on the engine's device (sent from pinned memory without a sync
        on CUDA; the host buffer itself on CPU); a request whose row could not be filled fails
        (its row allows every token, and what is sampled there is dropped). The next fill
        goes to the ring's next buffer."""
        t0 = time.perf_counter()
        out = fut.result()
        self.counters.mask_wait_s += time.perf_counter() - t0
        if out is None:
            return None
        bitmask, failed = out
        for req, e in failed:
            self._broken(req, "filling its token mask", e)
        return self._ring.send(bitmask.shape[0])

    def _broken(self, req: Req, doing: str, e: Exception) -> None:
        """``req``'s matcher raised while ``doing``: the request fails alone (a 400: its
        constraint could not be enforced)."""
        log.warning("request %s: its matcher failed while %s", req.request_id, doing,
                    exc_info=e)
        req.fail(ErrorKind.CONSTRAINT_INVALID, f"the constraint could not be enforced: its "
                 f"grammar failed while {doing}: {type(e).__name__}: {e}")
        self.counters.grammar_errors += 1

    def accept(self, req: Req, token: int) -> bool:
        """Advance ``req``'s matcher by a sampled token; False (with ``req.error``) if the
        grammar rejected it, or its matcher failed."""
        m = req.matcher
        try:
            if m is None or m.accept_token(token):
                return True
        except Exception as e:  # noqa: BLE001 - fails this request only
            self._broken(req, f"accepting token {token}", e)
            return False
        self._fail(req, f"it reached a dead end: {m.error()}")
        return False

    def _fail(self, req: Req, why: str) -> None:
        m = req.matcher
        if m is not None and m.exhausted:
            req.fail(ErrorKind.CONSTRAINT_DEAD_END, f"the constraint cannot be completed: {m.error()}")
            self.counters.check_failures += 1
        else:
            req.fail(ErrorKind.CONSTRAINT_DEAD_END, f"the constraint cannot be completed: {why}")
        self.counters.grammar_errors += 1

    def retraction(self, req: Req) -> int:
        """Tokens to take back from ``req`` after its last accepted token (a value check failed
        and its matcher rolled back, or the loop guard took back a copied item; that token
        counts), counted as one retry or one loop-guard cut; 0, with ``req.error``, if its
        matcher failed."""
        m = req.matcher
        try:
            n = m.take_retraction() if m is not None else 0
        except Exception as e:  # noqa: BLE001 - fails this request only
            self._broken(req, "taking back a failed value", e)
            return 0
        guard = m.inner if isinstance(m, ReasoningMatcher) else m
        cuts = guard.take_guard_cuts() if isinstance(guard, LoopGuardMatcher) else 0
        if cuts:
            self.counters.loop_guard_cuts += cuts
            log.info("request %s: the loop guard took back a copied array item",
                     req.request_id)
        elif n:
            self.counters.check_retries += 1
        return n

    def dead_end(self, req: Req) -> None:
        """Fail ``req``: its constraint allowed no token at all (the sampler found none)."""
        self._fail(req, "it allows no token here (dead end)")

    def forced(self, req: Req) -> tuple[list[int], int]:
        """The jump-forward span after the last accepted token (already accepted by the
        matcher), or [] when jump-forward is off for the engine or the request. When the
        grammar is complete and only a stop token may follow, the span ends with that stop
        token, so the request finishes without another forward.

        Returns the tokens to append and how many of ``req``'s tokens to take back first (a
        value check that failed inside the span rolled the matcher back before it). If its
        matcher fails, ``req.error`` is set and nothing is appended."""
        try:
            return self._forced(req)
        except Exception as e:  # noqa: BLE001 - fails this request only
            self._broken(req, "computing its forced tokens", e)
            return [], 0

    def _forced(self, req: Req) -> tuple[list[int], int]:
        m = req.matcher
        if m is None or not (self.jump_forward and req.params.jump_forward):
            return [], 0
        span = m.forced_tokens() if self._spans_for(req) else []
        # NOTE: a reasoning span's forced markers are taken as the matcher tokenized them
        marker = isinstance(m, ReasoningMatcher) and m.forcing
        if self.spans is not None and span and not marker:
            span = self.spans.canonical(req.output_ids, span)
        for i, tok in enumerate(span):
            ok = m.accept_token(tok)
            undo = self.retraction(req) if ok else 0
            if undo:
                kept = i + 1 - undo
                return (span[:kept], 0) if kept >= 0 else ([], -kept)
            if not ok:  # cannot happen for a sound backend; stay consistent
                if m.exhausted:
                    self._fail(req, "")
                else:
                    req.fail(ErrorKind.CONSTRAINT_DEAD_END, "the constraint cannot be "
                             f"completed: a token it forces was rejected: {m.error()}")
                return span[:i], 0
        stop = self._only_stop(req)
        if stop is not None and m.accept_token(stop):
            undo = self.retraction(req)
            if undo:
                kept = len(span) + 1 - undo
                return (span[:kept], 0) if kept >= 0 else ([], -kept)
            span.append(stop)
        elif stop is not None and m.exhausted:
            self._fail(req, "")
        self.counters.jump_forward_tokens += len(span)
        return span, 0

    def _spans_for(self, req: Req) -> bool:
        """Whether ``req`` jumps forward the spans its constraint forces mid-reply (a JSON
        schema's key names only with ``json_schema_spans``); the final stop token is fed
        without a decode step either way."""
        c = req.params.constraint
        if isinstance(req.matcher, ReasoningMatcher) and req.matcher.forcing:
            return True  # NOTE: the span's opening or close, and what follows it
        return self.json_spans or c is None or c.kind is not ConstraintKind.JSON_SCHEMA

    def _only_stop(self, req: Req) -> int | None:
        """The stop token to emit if the matcher allows nothing but stop tokens, else None."""
        m = req.matcher
        assert m is not None
        bitmask = self._bitmask
        row = len(bitmask) - 1  # NOTE: the scratch row, never sent (bitmask_ring.py)
        m.fill_bitmask(bitmask, row)
        words = bitmask[row].numpy().view(np.uint32)
        stop_part = words[self._stop_words] & self._stop_bits
        rest = words.copy()
        rest[self._stop_words] &= ~self._stop_bits
        if rest.any() or not stop_part.any():
            return None
        return next(t for t, hit in zip(self._stops, stop_part) if hit)

    def shutdown(self) -> None:
        """Stop the mask thread (waiting for a fill in flight) and the compiler's background
        work (at engine shutdown; idempotent). A fill asked for later runs on the caller's
        thread."""
        self._worker.close(wait=True)
        self.compiler.close()
