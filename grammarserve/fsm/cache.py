"""Compiled-grammar cache: LRU bounded in bytes, one shared future per in-flight key, and a
compile timeout that fails the waiters without blocking other compiles."""

from __future__ import annotations

import heapq
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from grammarserve.errors import GrammarError, GrammarTimeoutError
from grammarserve.fsm.matcher import CompiledGrammar


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of the cache counters."""

    hits: int
    misses: int
    shared: int  # requests that joined an in-flight compile of the same key
    timeouts: int
    errors: int
    evictions: int
    entries: int
    bytes: int
    max_bytes: int
    compile_s_total: float
    compile_s_max: float


class _Job:
    """One in-flight compile: the shared future, its deadline and the worker running it."""

    def __init__(self, key: str, fn: Callable[[], CompiledGrammar], deadline: float) -> None:
        self.key = key
        self.fn = fn
        self.deadline = deadline
        self.future: Future[CompiledGrammar] = Future()
        self.worker: int | None = None  # id of the worker thread running it


class GrammarCache:
    """LRU of ``CompiledGrammar`` bounded by ``max_bytes`` plus the compile worker pool.

    NOTE: ``threads`` persistent workers take jobs from a queue; one watchdog thread fails
    jobs past their deadline. A worker whose job timed out is written off (it exits once the
    backend returns, and the result is still cached) and a replacement worker starts at once,
    so a pathological schema never holds up the queue behind it.
    """

    def __init__(self, *, max_bytes: int, timeout_s: float, threads: int) -> None:
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._lru: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._inflight: dict[str, _Job] = {}
        self._bytes = 0
        self._counts = {"hits": 0, "misses": 0, "shared": 0, "timeouts": 0, "errors": 0,
                        "evictions": 0}
        self._compile_s_total = 0.0
        self._compile_s_max = 0.0
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._written_off: set[int] = set()
        self._deadlines: list[tuple[float, int, _Job]] = []
        self._watch = threading.Condition(self._lock)
        self._seq = 0
        self._threads = threads
        self._started = False

    def _start(self) -> None:
        # Called with the lock held, on first use (no threads for an unused cache).
        self._started = True
        for _ in range(self._threads):
            self._spawn_worker()
        threading.Thread(target=self._watchdog, daemon=True,
                         name="grammarserve-compile-watchdog").start()

    def _spawn_worker(self) -> None:
        threading.Thread(target=self._worker, daemon=True, name="grammarserve-compile").start()

    def get_or_compile(self, key: str, compile_fn: Callable[[], CompiledGrammar]
                       ) -> Future[CompiledGrammar]:
        """The cached grammar for ``key``, the in-flight compile of it, or a new compile."""
        with self._lock:
            hit = self._lru.get(key)
            if hit is not None:
                self._lru.move_to_end(key)
                self._counts["hits"] += 1
                done: Future[CompiledGrammar] = Future()
                done.set_result(hit)
                return done
            job = self._inflight.get(key)
            if job is not None:
                self._counts["shared"] += 1
                return job.future
            self._counts["misses"] += 1
            if not self._started:
                self._start()
            job = self._inflight[key] = _Job(key, compile_fn,
                                             time.monotonic() + self.timeout_s)
            self._seq += 1
            heapq.heappush(self._deadlines, (job.deadline, self._seq, job))
            self._watch.notify()
        self._jobs.put(job)
        return job.future

    def _worker(self) -> None:
        me = threading.get_ident()
        while True:
            job = self._jobs.get()
            with self._lock:
                if job.future.done():  # timed out while queued
                    continue
                job.worker = me
            start = time.perf_counter()
            try:
                result: CompiledGrammar | None = job.fn()
                exc: BaseException | None = None
            except BaseException as e:  # noqa: BLE001 - delivered to the waiters
                result = None
                exc = e if isinstance(e, GrammarError) else GrammarError(
                    f"grammar compile failed: {type(e).__name__}: {e}")
            self._finish(job, result, exc, time.perf_counter() - start)
            with self._lock:
                if me in self._written_off:  # replaced after a timeout
                    self._written_off.discard(me)
                    return

    def _finish(self, job: _Job, result: CompiledGrammar | None,
                exc: BaseException | None, elapsed: float) -> None:
        with self._lock:
            self._compile_s_total += elapsed
            self._compile_s_max = max(self._compile_s_max, elapsed)
            if self._inflight.get(job.key) is job:
                del self._inflight[job.key]
            if result is not None:
                self._insert(job.key, result)
            else:
                self._counts["errors"] += 1
            if job.future.done():
                return
        if result is not None:
            job.future.set_result(result)
        else:
            job.future.set_exception(exc if exc is not None else GrammarError("compile failed"))

    def _watchdog(self) -> None:
        while True:
            with self._lock:
                while not self._deadlines or self._deadlines[0][0] > time.monotonic():
                    wait = self._deadlines[0][0] - time.monotonic() if self._deadlines else None
                    self._watch.wait(wait)
                _, _, job = heapq.heappop(self._deadlines)
                if job.future.done():
                    continue
                self._counts["timeouts"] += 1
                if self._inflight.get(job.key) is job:
                    del self._inflight[job.key]
                if job.worker is not None:
                    self._written_off.add(job.worker)
                    self._spawn_worker()
            job.future.set_exception(GrammarTimeoutError(
                f"grammar compile exceeded the {self.timeout_s:g} s timeout; simplify the "
                "schema (fewer alternatives, smaller bounds) or raise compile_timeout_s"))

    def _insert(self, key: str, value: CompiledGrammar) -> None:
        if value.size_bytes > self.max_bytes or key in self._lru:
            return
        self._lru[key] = value
        # NOTE: sizes can grow after insertion (background backend upgrades), so the total is
        # recomputed rather than tracked incrementally.
        self._bytes = sum(g.size_bytes for g in self._lru.values())
        while self._bytes > self.max_bytes and self._lru:
            _, old = self._lru.popitem(last=False)
            self._bytes -= old.size_bytes
            self._counts["evictions"] += 1

    def clear(self) -> None:
        """Drop every cached grammar (in-flight compiles are unaffected)."""
        with self._lock:
            self._lru.clear()
            self._bytes = 0

    def stats(self) -> CacheStats:
        """A snapshot of the counters."""
        with self._lock:
            self._bytes = sum(g.size_bytes for g in self._lru.values())
            return CacheStats(entries=len(self._lru), bytes=self._bytes, max_bytes=self.max_bytes,
                              compile_s_total=self._compile_s_total,
                              compile_s_max=self._compile_s_max, **self._counts)
