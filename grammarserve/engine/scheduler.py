"""Continuous batching under a per-step token budget, with chunked prefill, a radix prefix cache,
cache-aware admission and preemption.

Each step every running request brings its pending tokens (one decode token, a jump-forward span,
or the next prefill chunk); then waiting requests are admitted, longest cached prefix first, while
the token budget, the request table and the KV pool allow. A waiting request that shares an
uncached prefix with a request still prefilling waits one step so the prefix is computed once.
When the pool runs dry, unlocked cache leaves are evicted; then the newest running request is
preempted (its computed KV goes into the cache, and it is recomputed from there later).
With KV tiers (``engine/kv_tiers``), a queued request's prompt blocks are prefetched from disk,
and at admission the blocks past the tree's match are restored from a tier into the tree first;
prompt KV entering the tree is written through to the disk tier.

Slot ownership (NOTE: the invariant that keeps the pool leak-free): a request's table row lists
``num_allocated`` slots; the first ``tree_len`` of them belong to the radix tree (and are locked by
the request), the rest belong to the request until it inserts them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from grammarserve.attention.kv_pool import KVPool, ReqToTokenPool
from grammarserve.engine.kv_tiers.tiers import KVTiers
from grammarserve.engine.radix_cache import RadixCache
from grammarserve.engine.request import Req, ReqStatus

LPM_MAX_QUEUE = 128  # longer queues fall back to arrival order (matching them all costs too much)
SHARED_PREFIX_MIN = 32  # defer a request whose uncached prefix overlaps an in-flight prefill


@dataclass(frozen=True)
class ScheduledReq:
    req: Req
    num_tokens: int  # tokens fed this step: req.tokens[req.num_computed:], then the draft's
    num_draft: int = 0  # of them, the speculative draft's (req.draft, cut to this length)

    @property
    def samples(self) -> bool:
        """Whether the request samples after this step (all its pending tokens are fed)."""
        return self.num_tokens - self.num_draft == self.req.num_pending


def logit_rows(work: list[ScheduledReq]) -> list[int] | None:
    """The rows of a step's logits that are sampled (None: all of them): one per request
    that samples, plus one per draft token it verifies."""
    rows: list[int] = []
    at = 0
    for w in work:
        if w.samples:
            rows.extend(range(at, at + 1 + w.num_draft))
        at += 1 + w.num_draft
    return rows if len(rows) < at else None


class Scheduler:
    def __init__(self, pool: KVPool, req_to_token: ReqToTokenPool, cache: RadixCache | None,
                 *, max_batch_tokens: int, tiers: KVTiers | None = None) -> None:
        self.pool = pool
        self.req_to_token = req_to_token
        self.cache = cache
        self.tiers = tiers if cache is not None else None
        self.max_batch_tokens = max_batch_tokens
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.max_running: int | None = None  # set by the engine each step (BatchSizer)
        self.prefill_cap: int | None = None  # set by the engine each step (StepPacer)
        self.num_preemptions = 0

    def add(self, req: Req) -> None:
        self.waiting.append(req)
        if self.tiers is not None and self.cache is not None:
            prompt = req.tokens[:-1]
            cached = self.cache.match_prefix(prompt, req.namespace).length
            self.tiers.prefetch(prompt, req.namespace, cached)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def decoding(self) -> bool:
        """Whether any running request is past its prompt (a stream a long step would stall)."""
        return any(r.num_computed >= len(r.prompt_ids) for r in self.running)

    @property
    def admittable(self) -> bool:
        """Whether a request waits and the request table and running cap leave room for it."""
        return bool(self.waiting) and self.req_to_token.num_free > 0 and (
            self.max_running is None or len(self.running) < self.max_running)

    def schedule(self) -> list[ScheduledReq]:
        """Pick this step's work and allocate KV slots for it: requests past their prompt
        first, then prefill chunks and admissions within ``prefill_cap`` tokens. While a
        request can be admitted, prefill chunks take at most half of that, so a newcomer
        starts beside a long prompt instead of after all its chunks."""
        out: list[ScheduledReq] = []
        budget = self._feed([r for r in self.running if r.num_computed >= len(r.prompt_ids)],
                            self.max_batch_tokens, out)
        held = max(budget - self.prefill_cap, 0) if self.prefill_cap is not None else 0
        kept = (budget - held) // 2 if self.admittable else 0
        budget = kept + self._feed([r for r in self.running if r.num_computed < len(r.prompt_ids)],
                                   budget - held - kept, out)
        admitted: list[Req] = []
        for req in self._admission_order():
            if budget == 0 or self.req_to_token.num_free == 0 or (
                    self.max_running is not None and len(self.running) >= self.max_running):
                break
            took = self._admit(req, budget, admitted)
            if took is None:
                continue
            admitted.append(req)
            out.append(ScheduledReq(req, took))
            budget -= took
        return out

    def _feed(self, reqs: list[Req], budget: int, out: list[ScheduledReq]) -> int:
        """Schedule running ``reqs``' pending tokens within ``budget`` (preempting the newest
        request where the pool runs dry); returns the budget left."""
        for req in reqs:
            if req.status is not ReqStatus.RUNNING or budget == 0:
                continue
            n = min(req.num_pending, budget)
            draft = self._draft_room(req, n, budget)
            while not self._reserve(req, n + draft):
                victim = self.running[-1]
                self.preempt(victim)
                if victim is req:
                    break
            if req.status is ReqStatus.RUNNING:
                out.append(ScheduledReq(req, n + draft, draft))
                budget -= n + draft
            else:
                req.draft = []
        return budget

    def _draft_room(self, req: Req, n: int, budget: int) -> int:
        """How much of ``req.draft`` rides along (cutting ``req.draft`` to it): all of it
        if the pending tokens fit whole, within the token budget and the pool's free slots
        (a draft never evicts cached prefixes or preempts a request)."""
        if n < req.num_pending:
            keep = 0
        else:
            keep = min(len(req.draft), budget - n, max(self.pool.num_free - n, 0))
        del req.draft[keep:]
        return keep

    def _admission_order(self) -> list[Req]:
        reqs = list(self.waiting)
        if self.cache is None or len(reqs) > LPM_MAX_QUEUE:
            return reqs
        cache = self.cache
        return sorted(reqs, key=lambda r: (-cache.match_prefix(r.tokens[:-1], r.namespace).length,
                                           r.arrival))

    def _admit(self, req: Req, budget: int, admitted: list[Req]) -> int | None:
        """Try to start ``req``; returns its token count this step, or None to leave it waiting."""
        if self.tiers is not None:
            self._restore(req, budget)
        match = (self.cache.match_prefix(req.tokens[:-1], req.namespace)
                 if self.cache is not None else None)
        cached = match.length if match is not None else 0
        inflight = admitted + [r for r in self.running if r.num_computed < len(r.prompt_ids)]
        if any(r.namespace == req.namespace and
               _common_len(r.tokens, req.tokens) >= cached + SHARED_PREFIX_MIN for r in inflight):
            return None
        n = min(len(req.tokens) - cached, budget)
        if match is not None and self.cache is not None:
            self.cache.lock(match.node)  # NOTE: before _make_room, so eviction cannot take it
        if not self._make_room(n):
            if match is not None and self.cache is not None:
                self.cache.unlock(match.node)
            return None
        self.waiting.remove(req)
        req.row = self.req_to_token.alloc()
        req.status = ReqStatus.RUNNING
        if req.num_cached_prompt is None:
            req.num_cached_prompt = cached
        if match is not None:
            self.req_to_token.write(req.row, 0, match.slots)
            req.cache_node = match.node
        req.num_computed = req.num_allocated = req.tree_len = cached
        self.running.append(req)
        self._reserve(req, n)
        return n

    def _restore(self, req: Req, budget: int) -> None:
        """Bring ``req``'s prompt blocks past the tree's match back from a lower tier into the
        tree (``KVTiers.restore``), only if the pool can then also take its first chunk: a
        restore that admission cannot use would be evicted again by the next one (a request
        that waits for room restores when it is admitted)."""
        assert self.cache is not None and self.tiers is not None
        prompt = req.tokens[:-1]
        match = self.cache.match_prefix(prompt, req.namespace)
        have = self.tiers.available(prompt, req.namespace, match.length)
        if have == 0:
            return
        need = have + min(len(req.tokens) - match.length - have, budget)
        self.cache.lock(match.node)
        try:
            evictable = self.cache.total_tokens - self.cache.locked_tokens
            if self.pool.num_free + evictable < need:
                return
            slots = self.tiers.restore(prompt, req.namespace, match.length, match.slots,
                                       self._make_room)
        finally:
            self.cache.unlock(match.node)
        if slots is not None:
            already, _ = self.cache.insert(prompt[:slots.numel()], slots, req.namespace)
            self.pool.free(slots[match.length:already])  # NOTE: none, unless inserted meanwhile

    def _make_room(self, n: int) -> bool:
        short = n - self.pool.num_free
        if short > 0 and self.cache is not None:
            self.cache.evict(short)
        return self.pool.num_free >= n

    def _reserve(self, req: Req, n: int) -> bool:
        if not self._make_room(n):
            return False
        self.req_to_token.write(req.row, req.num_computed, self.pool.alloc(n))
        req.num_allocated = req.num_computed + n
        return True

    def cache_prefix(self, req: Req) -> None:
        """Insert ``req``'s computed tokens into the cache now (after a prefill chunk), so that
        others can reuse them while it runs."""
        if self.cache is None or req.num_computed <= req.tree_len:
            return
        tokens = req.tokens[:req.num_computed]
        slots = self.req_to_token.slots(req.row, req.num_computed).clone()
        already, node = self.cache.insert(tokens, slots, req.namespace)
        if self.tiers is not None:
            end = min(req.num_computed, len(req.prompt_ids))
            self.tiers.write_through(tokens[:end], slots[:end], req.namespace, req.tree_len)
        if already > req.tree_len:
            # Someone inserted part of this meanwhile: free our copies, read the tree's instead.
            self.pool.free(slots[req.tree_len:already])
            self.req_to_token.write(req.row, 0, self.cache.match_prefix(
                tokens, req.namespace).slots)
        self.cache.lock(node)
        if req.cache_node is not None:
            self.cache.unlock(req.cache_node)
        req.cache_node, req.tree_len = node, req.num_computed

    def rewind(self, req: Req, computed: int) -> None:
        """Forget the KV of positions ``computed ..`` of a running ``req`` (its tokens there
        were taken back, or are fed again): its own slots there go back to the pool, the
        tree's stay in the tree, and it locks the tree only up to ``computed``."""
        if req.status is not ReqStatus.RUNNING or computed >= req.num_allocated:
            req.num_computed = min(req.num_computed, computed)
            return
        tree_len = req.tree_len if self.cache is not None else 0
        own = self.req_to_token.slots(req.row, req.num_allocated)[max(computed, tree_len):]
        self.pool.free(own.clone())
        if self.cache is not None and tree_len > computed:
            node = self.cache.match_prefix(req.tokens[:computed], req.namespace).node
            self.cache.lock(node)
            if req.cache_node is not None:
                self.cache.unlock(req.cache_node)
            req.cache_node, req.tree_len = node, computed
        req.num_computed = req.num_allocated = computed

    def _release(self, req: Req) -> None:
        """Give up ``req``'s table row: computed KV goes to the cache, the rest back to the pool."""
        self.cache_prefix(req)
        start = req.tree_len if self.cache is not None else 0
        self.pool.free(self.req_to_token.slots(req.row, req.num_allocated)[start:].clone())
        if self.cache is not None and req.cache_node is not None:
            self.cache.unlock(req.cache_node)
        self.req_to_token.free(req.row)
        req.row, req.num_allocated, req.tree_len, req.cache_node = -1, 0, 0, None

    def preempt(self, req: Req) -> None:
        """Stop ``req`` and put it back at the head of the queue (recomputed later, from the
        cache where its KV survives)."""
        self._release(req)
        self.running.remove(req)
        req.num_computed = 0
        req.status = ReqStatus.WAITING
        self.waiting.appendleft(req)
        self.num_preemptions += 1

    def finish(self, req: Req) -> None:
        """Free a finished (or aborted) request's resources."""
        if req in self.running:
            self._release(req)
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.status = ReqStatus.FINISHED


def _common_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
