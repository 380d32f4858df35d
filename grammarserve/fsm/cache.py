"""Compiled-grammar cache: LRU bounded in bytes, one shared future per in-flight key, a
compile timeout that fails the waiters without blocking other compiles, and a negative cache:
a key whose compile was refused (or timed out) is refused again from memory, never compiled
again into the same failure."""

from __future__ import annotations

import atexit
import copy
import heapq
import queue
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass

from grammarserve.errors import GrammarError, GrammarTimeoutError
from grammarserve.fsm.deadlines import Deadline, compiling_until
from grammarserve.fsm.disk_cache import DiskCacheStats
from grammarserve.fsm.limits import GrammarLimits
from grammarserve.fsm.lru import BoundedLRU
from grammarserve.fsm.matcher import CompiledGrammar

#: Longest time between two full recomputes of the cached bytes on insertion (seconds).
_RESIZE_S = 1.0


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
    refused: int = 0  # requests refused from the negative cache, without a compile
    refused_entries: int = 0
    disk: DiskCacheStats | None = None  # the disk cache's counters (None: no disk cache)


class _Job:
    """One in-flight compile: the shared future, its deadline and the worker running it."""

    def __init__(self, key: str, fn: Callable[[], CompiledGrammar], deadline: float) -> None:
        self.key = key
        self.fn = fn
        self.deadline = deadline
        self.due = Deadline(deadline)  # what the compile reads (moved to now if abandoned)
        self.waiters = 1  # requests given its future and not gone
        self.abandoned = False
        self.future: Future[CompiledGrammar] = Future()
        self.worker: int | None = None  # id of the worker thread running it
        self.cancelled = False  # the cache closed before a worker took it


def _close_at_interpreter_exit(cache: GrammarCache) -> None:
    """Close ``cache`` (if still alive) when the interpreter starts to exit, so a compile
    running then finishes (its crash-journal entry closed) instead of being frozen mid-way."""
    me = weakref.ref(cache)

    def close_if_alive() -> None:
        alive = me()
        if alive is not None:
            alive.close()

    # NOTE: threading's exit hooks run while daemon threads still run; atexit's run later
    register = getattr(threading, "_register_atexit", atexit.register)
    try:
        register(close_if_alive)
    except RuntimeError:  # the interpreter is already shutting down
        pass


def _settle(future: Future[CompiledGrammar], result: CompiledGrammar | None,
            exc: GrammarError) -> None:
    """Deliver ``result`` (else ``exc``) unless ``future`` holds an outcome already (the
    watchdog, a worker and ``close`` may race to it; the first one stands)."""
    try:
        if result is not None:
            future.set_result(result)
        else:
            future.set_exception(exc)
    except InvalidStateError:
        pass


class GrammarCache:
    """LRU of ``CompiledGrammar`` bounded by ``max_bytes`` plus the compile worker pool.

    NOTE: ``threads`` persistent workers take jobs from a queue; one watchdog thread fails
    jobs past their deadline. A worker whose job timed out is written off (it exits once the
    backend returns, and the result is still cached) and a replacement worker starts at once,
    so a pathological schema never holds up the queue behind it. :meth:`close` stops them all.
    """

    def __init__(self, *, max_bytes: int, timeout_s: float, threads: int,
                 limits: GrammarLimits | None = None) -> None:
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.limits = limits or GrammarLimits()
        self._lock = threading.Lock()
        self._lru: OrderedDict[str, CompiledGrammar] = OrderedDict()
        # key -> (the refusal, when it expires: +inf for the input's own faults)
        self._refused: BoundedLRU[tuple[GrammarError, float]] = BoundedLRU(
            self.limits.negative_entries, self.limits.memo_bytes)
        self._inflight: dict[str, _Job] = {}
        self._bytes = 0
        self._sized_at = float("-inf")  # when self._bytes was last recomputed in full
        self._counts = {"hits": 0, "misses": 0, "shared": 0, "timeouts": 0, "errors": 0,
                        "evictions": 0, "refused": 0}
        self._compile_s_total = 0.0
        self._compile_s_max = 0.0
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()  # None: exit
        self._written_off: set[int] = set()
        self._deadlines: list[tuple[float, int, _Job]] = []
        self._watch = threading.Condition(self._lock)
        self._seq = 0
        self._threads = threads
        self._started = False
        self._closed = False
        self._live: set[threading.Thread] = set()  # workers and the watchdog

    def _start(self) -> None:
        # Called with the lock held, on first use (no threads for an unused cache).
        self._started = True
        for _ in range(self._threads):
            self._spawn_worker()
        self._spawn(self._watchdog, "grammarserve-compile-watchdog")
        _close_at_interpreter_exit(self)

    def _spawn_worker(self) -> None:
        self._spawn(self._worker, "grammarserve-compile")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        # Called with the lock held.
        thread = threading.Thread(target=self._run, args=(target,), daemon=True, name=name)
        self._live.add(thread)
        thread.start()

    def _run(self, target: Callable[[], None]) -> None:
        try:
            target()
        finally:
            with self._lock:
                self._live.discard(threading.current_thread())

    def get_or_compile(self, key: str, compile_fn: Callable[[], CompiledGrammar]
                       ) -> Future[CompiledGrammar]:
        """The cached grammar for ``key``, the in-flight compile of it, or a new compile; a
        key refused before is refused again at once (a copy of the same error). After
        :meth:`close`, a new compile runs on the caller's thread, without a timeout."""
        with self._lock:
            refusal = self._refusal(key)
            if refusal is not None:
                self._counts["refused"] += 1
                failed: Future[CompiledGrammar] = Future()
                failed.set_exception(refusal)
                return failed
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
                job.waiters += 1
                return job.future
            self._counts["misses"] += 1
            if self._closed:
                job = self._inflight[key] = _Job(key, compile_fn, float("inf"))
                inline: _Job | None = job
            else:
                inline = None
                job = self._enqueue(key, compile_fn)
        if inline is not None:
            self._execute(inline)
        else:
            self._jobs.put(job)
        return job.future

    def _enqueue(self, key: str, compile_fn: Callable[[], CompiledGrammar]) -> _Job:
        # Called with the lock held: the job, in flight and under the watchdog.
        if not self._started:
            self._start()
        job = self._inflight[key] = _Job(key, compile_fn, time.monotonic() + self.timeout_s)
        self._seq += 1
        # NOTE: the watchdog sleeps until the earliest deadline; waking it (a thread switch
        # on every cold compile) is needed only when this one comes first.
        earliest = not self._deadlines or job.deadline < self._deadlines[0][0]
        heapq.heappush(self._deadlines, (job.deadline, self._seq, job))
        if earliest:
            self._watch.notify()
        return job

    def _worker(self) -> None:
        me = threading.get_ident()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._lock:
                if job.future.done() or job.cancelled:  # timed out or closed while queued
                    continue
                job.worker = me
            self._execute(job)
            with self._lock:
                if me in self._written_off:  # replaced after a timeout
                    self._written_off.discard(me)
                    return

    def _execute(self, job: _Job) -> None:
        """Run ``job``'s compile on this thread and deliver the outcome."""
        start = time.perf_counter()
        final = False
        try:
            with compiling_until(job.due):
                result: CompiledGrammar | None = job.fn()
            exc: GrammarError | None = None
        except BaseException as e:  # noqa: BLE001 - delivered to the waiters
            result = None
            # NOTE: a refusal of the input is final; anything else (a backend failure, no
            # memory, a probe's timeout) may be the moment's: remembered for the TTL only.
            final = isinstance(e, GrammarError) and not isinstance(e, GrammarTimeoutError)
            exc = e if isinstance(e, GrammarError) else GrammarError(
                f"grammar compile failed: {type(e).__name__}: {e}")
        self._finish(job, result, exc, time.perf_counter() - start, final=final)

    def _finish(self, job: _Job, result: CompiledGrammar | None, exc: GrammarError | None,
                elapsed: float, *, final: bool) -> None:
        with self._lock:
            self._compile_s_total += elapsed
            self._compile_s_max = max(self._compile_s_max, elapsed)
            if self._inflight.get(job.key) is job:
                del self._inflight[job.key]
            if result is not None:
                self._refused.pop(job.key)  # it timed out, then compiled after all
                self._insert(job.key, result)
            else:
                self._counts["errors"] += 1
                if exc is not None and not job.abandoned:  # NOTE: stopped, not refused
                    self._remember(job.key, exc, forever=final)
            if job.future.done():
                return
        _settle(job.future, result, exc if exc is not None else GrammarError("compile failed"))

    def _watchdog(self) -> None:
        while True:
            with self._lock:
                while not self._deadlines or self._deadlines[0][0] > time.monotonic():
                    if self._closed:
                        return
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
                timeout = GrammarTimeoutError(
                    f"grammar compile exceeded the {self.timeout_s:g} s timeout; simplify the "
                    "schema (fewer alternatives, smaller bounds) or raise compile_timeout_s")
                # NOTE: the written-off worker may still be compiling it; a resubmission within
                # the TTL must not start a second one beside it.
                self._remember(job.key, timeout, forever=False)
            _settle(job.future, None, timeout)

    def _insert(self, key: str, value: CompiledGrammar) -> None:
        if value.size_bytes > self.max_bytes or key in self._lru:
            return
        self._lru[key] = value
        # NOTE: sizes grow after insertion (lazily built masks, background upgrades), so the
        # total is recomputed, but at most every _RESIZE_S: it costs ~3.6 us a cached grammar
        # (1-2 ms on every cold compile with a few hundred cached); in between, it is added to.
        now = time.monotonic()
        if now - self._sized_at >= _RESIZE_S:
            self._bytes, self._sized_at = sum(g.size_bytes for g in self._lru.values()), now
        else:
            self._bytes += value.size_bytes
        while self._bytes > self.max_bytes and self._lru:
            _, old = self._lru.popitem(last=False)
            self._bytes = max(0, self._bytes - old.size_bytes)
            self._counts["evictions"] += 1

    def _remember(self, key: str, error: GrammarError, *, forever: bool) -> None:
        # Called with the lock held.
        expires = float("inf") if forever else time.monotonic() + self.limits.negative_ttl_s
        self._refused.put(key, (copy.copy(error).with_traceback(None), expires),
                          len(str(error)))

    def _refusal(self, key: str) -> GrammarError | None:
        # Called with the lock held.
        entry = self._refused.get(key)
        if entry is None:
            return None
        error, expires = entry
        if time.monotonic() >= expires:
            self._refused.pop(key)
            return None
        return copy.copy(error).with_traceback(None)

    def abandon(self, future: Future[CompiledGrammar]) -> None:
        """One request given ``future`` by :meth:`get_or_compile` has left. When every request
        waiting for an in-flight compile has left, the compile is dropped: one not started
        never starts; a running one is told to stop (its deadline moves to now, which stops
        llguidance's probe and kills its child) and its worker is replaced, as at a timeout;
        its outcome is not remembered as a refusal. The future fails with ``GrammarError``.
        Nothing happens for a future that is done or not in flight."""
        with self._lock:
            job = next((j for j in self._inflight.values() if j.future is future), None)
            if job is None or future.done():
                return
            job.waiters -= 1
            if job.waiters > 0:
                return
            job.abandoned = True
            job.cancelled = job.worker is None
            job.due.at = float("-inf")
            del self._inflight[job.key]
            if job.worker is not None and not self._closed:
                self._written_off.add(job.worker)
                self._spawn_worker()
        _settle(future, None, GrammarError("the compile was abandoned: every request waiting "
                                           "for it left"))

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the workers and the watchdog: compiles not started yet fail with
        ``GrammarError``; a worker in a backend compile finishes it (its waiters get the
        outcome, and its crash-journal entry is closed) and exits. Waits up to ``timeout_s``
        for them to exit. Later compiles run on the caller's thread (``get_or_compile``)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            queued = [j for j in self._inflight.values() if j.worker is None]
            for job in queued:
                job.cancelled = True
                del self._inflight[job.key]
            workers = [t for t in self._live if t.name == "grammarserve-compile"]
            self._watch.notify_all()
            live = list(self._live)
        for job in queued:
            _settle(job.future, None, GrammarError("the grammar compiler was closed"))
        for _ in workers:
            self._jobs.put(None)
        deadline = time.monotonic() + timeout_s
        for thread in live:
            thread.join(max(0.0, deadline - time.monotonic()))

    def clear(self) -> None:
        """Drop every cached grammar and refusal (in-flight compiles are unaffected)."""
        with self._lock:
            self._lru.clear()
            self._refused.clear()
            self._bytes = 0

    def stats(self) -> CacheStats:
        """A snapshot of the counters."""
        with self._lock:
            self._bytes = sum(g.size_bytes for g in self._lru.values())
            c = self._counts
            return CacheStats(entries=len(self._lru), bytes=self._bytes, max_bytes=self.max_bytes,
                              compile_s_total=self._compile_s_total,
                              compile_s_max=self._compile_s_max,
                              refused_entries=len(self._refused), hits=c["hits"],
                              misses=c["misses"], shared=c["shared"], timeouts=c["timeouts"],
                              errors=c["errors"], evictions=c["evictions"],
                              refused=c["refused"])
