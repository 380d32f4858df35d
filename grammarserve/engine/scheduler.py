"""Continuous batching under a per-step token budget, with chunked prefill and preemption.

Each step every running request brings its pending tokens (one decode token, a jump-forward span,
or the next prefill chunk), then waiting requests are admitted in arrival order while the token
budget, the request table and the KV pool allow. When the pool runs dry the newest running request
is preempted: its KV is freed and it is recomputed later.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from grammarserve.engine.kv_pool import KVPool, ReqToTokenPool
from grammarserve.engine.request import Req, ReqStatus


@dataclass(frozen=True)
class ScheduledReq:
    req: Req
    num_tokens: int  # tokens of req.tokens[req.num_computed:] fed this step


class Scheduler:
    def __init__(self, pool: KVPool, req_to_token: ReqToTokenPool, *, max_batch_tokens: int) -> None:
        self.pool = pool
        self.req_to_token = req_to_token
        self.max_batch_tokens = max_batch_tokens
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []

    def add(self, req: Req) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledReq]:
        """Pick this step's work and allocate KV slots for it."""
        budget = self.max_batch_tokens
        out: list[ScheduledReq] = []
        for req in list(self.running):
            if req.status is not ReqStatus.RUNNING or budget == 0:
                continue
            n = min(req.num_pending, budget)
            while not self._reserve(req, n):
                victim = self.running[-1]
                self.preempt(victim)
                if victim is req:
                    break
            if req.status is ReqStatus.RUNNING:
                out.append(ScheduledReq(req, n))
                budget -= n
        while self.waiting and budget > 0 and self.req_to_token.num_free > 0:
            req = self.waiting[0]
            n = min(req.num_pending, budget)
            if n > self.pool.num_free:
                break
            self.waiting.popleft()
            req.row = self.req_to_token.alloc()
            req.status = ReqStatus.RUNNING
            self.running.append(req)
            self._reserve(req, n)
            out.append(ScheduledReq(req, n))
            budget -= n
        return out

    def _reserve(self, req: Req, n: int) -> bool:
        if n > self.pool.num_free:
            return False
        self.req_to_token.write(req.row, req.num_computed, self.pool.alloc(n))
        req.num_allocated = req.num_computed + n
        return True

    def _release(self, req: Req) -> None:
        self.pool.free(self.req_to_token.slots(req.row, req.num_allocated).clone())
        self.req_to_token.free(req.row)
        req.row, req.num_allocated = -1, 0

    def preempt(self, req: Req) -> None:
        """Free ``req``'s KV and put it back at the head of the queue (recomputed later)."""
        self._release(req)
        self.running.remove(req)
        req.num_computed = 0
        req.status = ReqStatus.WAITING
        self.waiting.appendleft(req)

    def finish(self, req: Req) -> None:
        """Free a finished (or aborted) request's KV and table row."""
        if req in self.running:
            self._release(req)
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.status = ReqStatus.FINISHED
