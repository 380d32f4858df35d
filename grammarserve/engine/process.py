"""Runs the engine loop in its own process; callers talk to it through a small message protocol.

Parent -> engine: ``AddRequest``, ``Abort``, ``GetStats``, ``Shutdown``.
Engine -> parent: ``Ready`` / ``StartupFailed`` once, then ``Outputs``, ``RequestFailed``, ``Stats``
/ ``StatsFailed``.
If the engine process dies, every waiting caller gets :class:`EngineDeadError` instead of a hang,
except the requests whose constraint was compiling then (``EngineConfig.grammar_crash_journal``,
``fsm/crash_journal.py``): a native crash in a grammar backend is theirs, so they get a 400 and
the death is :attr:`EngineProcess.crashed_by_request` (the supervisor does not count it).

Blocking callers iterate a :class:`RequestStream`; asyncio callers (the server) use
:meth:`EngineProcess.add_request_async`, whose :class:`AsyncRequestStream` is fed from the reader
thread with ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from grammarserve.config import EngineConfig
from grammarserve.engine.request import RequestOutput
from grammarserve.engine.stats import EngineStats
from grammarserve.engine.streams import AsyncRequestStream, RequestStream
from grammarserve.errors import (
    EngineDeadError,
    ErrorKind,
    GrammarserveError,
    InvalidRequestError,
    RequestFailedError,
)
from grammarserve.fsm.config import GrammarSpec
from grammarserve.fsm.crash_journal import CRASHED_MESSAGE, CrashJournal, spec_digest
from grammarserve.sampling_params import SamplingParams

log = logging.getLogger(__name__)

_S = TypeVar("_S", bound="RequestStream")


@dataclass(frozen=True)
class AddRequest:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    namespace: str = ""


@dataclass(frozen=True)
class Abort:
    request_id: str


@dataclass(frozen=True)
class GetStats:
    pass


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class Ready:
    info: dict[str, Any]


@dataclass(frozen=True)
class StartupFailed:
    message: str


@dataclass(frozen=True)
class Outputs:
    outputs: list[RequestOutput]


@dataclass(frozen=True)
class RequestFailed:
    request_id: str
    message: str
    param: str | None = None
    kind: ErrorKind = ErrorKind.INVALID_REQUEST  # ENGINE_FAILURE: an engine bug


@dataclass(frozen=True)
class Stats:
    stats: EngineStats


@dataclass(frozen=True)
class StatsFailed:
    message: str


class EngineProcess:
    """Client side of an engine running in a child process (spawned, so CUDA-safe)."""

    def __init__(self, config: EngineConfig, *, startup_timeout_s: float = 900.0) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_engine_main, args=(config, child), daemon=True,
                                 name="grammarserve-engine")
        self._proc.start()
        child.close()
        self._send_lock = threading.Lock()
        self._streams: dict[str, RequestStream] = {}
        self._stats_waiters: list[Future[EngineStats]] = []
        self._stats_lock = threading.Lock()  # waiters are answered in the order they asked
        self._dead: EngineDeadError | None = None
        self._died = threading.Event()  # set once, when the process is found gone
        folder = config.grammar_crash_journal
        self._journal = CrashJournal(folder) if folder is not None else None
        self._digests: dict[str, str] = {}  # request id -> its constraint's journal digest
        self.crashed_by_request = False  # set at death: a journaled compile was running
        if not self._conn.poll(startup_timeout_s):
            self._proc.kill()
            raise EngineDeadError(f"the engine did not start within {startup_timeout_s:.0f}s")
        try:
            first = self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(5)
            raise EngineDeadError(f"the engine process exited during start-up "
                                  f"(exit code {self._proc.exitcode})") from None
        if isinstance(first, StartupFailed):
            self._proc.join(5)
            raise GrammarserveError(first.message)
        self.info: dict[str, Any] = first.info
        self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                         name="grammarserve-engine-reader")
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self._dead is None and self._proc.is_alive()

    @property
    def exitcode(self) -> int | None:
        """The process's exit code once it ended (negative: killed by that signal)."""
        return self._proc.exitcode

    def wait_dead(self, timeout: float | None = None) -> bool:
        """Block until the engine process is found gone (crash, kill or shutdown); False if
        ``timeout`` passed first. Callers waiting on it have already been failed."""
        return self._died.wait(timeout)

    @property
    def pid(self) -> int | None:
        """The engine process's id (to signal it; None before it started)."""
        return self._proc.pid

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    *, namespace: str = "") -> RequestStream:
        """Submit a request; iterate the returned stream for its outputs."""
        return self._submit(RequestStream(request_id), prompt, params, namespace)

    def add_request_async(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                          *, namespace: str = "") -> AsyncRequestStream:
        """Submit a request from a coroutine; ``async for`` over the returned stream.

        Must be called with a running event loop (the outputs are delivered to it)."""
        stream = AsyncRequestStream(request_id, asyncio.get_running_loop())
        self._submit(stream, prompt, params, namespace)
        return stream

    def _submit(self, stream: _S, prompt: str | list[int], params: SamplingParams,
                namespace: str) -> _S:
        request_id = stream.request_id
        if self._dead is not None:
            raise self._dead
        if request_id in self._streams:
            raise InvalidRequestError(f"request id {request_id!r} is already in use",
                                      param="request_id")
        self._streams[request_id] = stream
        spec = params.constraint.prepared if params.constraint is not None else None
        if self._journal is not None and isinstance(spec, GrammarSpec):
            self._digests[request_id] = spec_digest(spec)
        self._send(AddRequest(request_id, prompt, params, namespace))
        return stream

    def abort(self, request_id: str) -> None:
        if request_id in self._streams and self._dead is None:
            self._send(Abort(request_id))

    def stats(self, timeout: float = 30.0) -> EngineStats:
        return self._request_stats().result(timeout=timeout)

    async def stats_async(self, timeout: float = 30.0) -> EngineStats:
        """:meth:`stats` without blocking the event loop."""
        return await asyncio.wait_for(asyncio.wrap_future(self._request_stats()), timeout)

    def _request_stats(self) -> Future[EngineStats]:
        fut: Future[EngineStats] = Future()
        if self._dead is not None:
            fut.set_exception(self._dead)
            return fut
        with self._stats_lock:
            self._stats_waiters.append(fut)
            self._send(GetStats())
        return fut

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine process (pending requests end with EngineDeadError)."""
        if self._proc.is_alive():
            try:
                self._send(Shutdown())
            except EngineDeadError:
                pass
            self._proc.join(timeout)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(timeout)

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _send(self, msg: object) -> None:
        try:
            with self._send_lock:
                self._conn.send(msg)
        except (OSError, ValueError) as e:
            self._fail_all(EngineDeadError(f"the engine process is gone: {e}"))
            raise self._dead or EngineDeadError(str(e)) from None

    def _read_loop(self) -> None:
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                self._proc.join(5)
                self._fail_all(EngineDeadError(
                    f"the engine process died (exit code {self._proc.exitcode})"))
                return
            if isinstance(msg, Outputs):
                for out in msg.outputs:
                    stream = self._streams.get(out.request_id)
                    if stream is not None:
                        stream.put(out)
                        if out.finished:
                            self._streams.pop(out.request_id, None)
                            self._digests.pop(out.request_id, None)
            elif isinstance(msg, RequestFailed):
                self._digests.pop(msg.request_id, None)
                stream = self._streams.pop(msg.request_id, None)
                if stream is not None:
                    stream.put(RequestFailedError(msg.message, kind=msg.kind, param=msg.param)
                               if msg.kind is ErrorKind.ENGINE_FAILURE else
                               InvalidRequestError(msg.message, param=msg.param, kind=msg.kind))
            elif isinstance(msg, (Stats, StatsFailed)) and self._stats_waiters:
                # NOTE: a caller that timed out (a long forward) cancelled its future: the
                # answer is dropped, and this thread must live on to read the outputs.
                waiter = self._stats_waiters.pop(0)
                if waiter.set_running_or_notify_cancel():
                    if isinstance(msg, Stats):
                        waiter.set_result(msg.stats)
                    else:
                        waiter.set_exception(GrammarserveError(msg.message))

    def _fail_all(self, err: EngineDeadError) -> None:
        if self._dead is None:
            self._dead = err
        crashed = self._collect_crashes() if not self._proc.is_alive() else set()
        for request_id, stream in list(self._streams.items()):
            if self._digests.get(request_id) in crashed:
                stream.put(InvalidRequestError(CRASHED_MESSAGE, param="response_format",
                                               kind=ErrorKind.CONSTRAINT_INVALID))
            else:
                stream.put(err)
        self._streams.clear()
        self._digests.clear()
        while self._stats_waiters:
            waiter = self._stats_waiters.pop(0)
            if waiter.set_running_or_notify_cancel():
                waiter.set_exception(err)
        self._died.set()


    def _collect_crashes(self) -> set[str]:
        """The digests of the constraints that were compiling when the process died (moved to
        the journal's crashed list, which the next engine refuses)."""
        if self._journal is None:
            return set()
        try:
            found = set(self._journal.collect())
        except OSError as e:  # the journal is a safety net: never let it hide the death
            log.warning("could not read the grammar crash journal: %s", e)
            return set()
        if found:
            self.crashed_by_request = True
            log.error("the engine died while compiling %d constraint(s); refusing them from now "
                      "on: %s", len(found), ", ".join(sorted(found)))
        return found


def _engine_main(config: EngineConfig, conn: Connection) -> None:
    """Child process body: build the engine, then serve messages and step while there is work."""
    from grammarserve.engine.engine import Engine
    from grammarserve.engine.heap import HeapTrimmer, freeze_startup_heap
    from grammarserve.engine.memory import process_rss_bytes

    try:
        engine = Engine(config)
    except Exception as e:  # reported to the parent, which raises it in the caller
        conn.send(StartupFailed(f"{type(e).__name__}: {e}" if not isinstance(
            e, GrammarserveError) else str(e)))
        return
    engine.warm_up()
    frozen = freeze_startup_heap()
    conn.send(Ready({"kv_capacity": engine.runner.pool.capacity,
                     "kv_bytes_per_token": engine.kv_bytes_per_token,
                     "memory_plan": engine.memory_plan,
                     "rss_bytes": process_rss_bytes(), "model": config.model,
                     "model_folder": str(engine.loaded.folder),
                     "vocab_size": engine.vocab_size,
                     "stop_token_ids": sorted(engine.eos_ids),
                     "max_model_len": engine.max_model_len, "gc_frozen_objects": frozen}))
    heap = HeapTrimmer()
    while True:
        heap.maybe_trim()
        if not engine.has_unfinished():
            conn.poll(None)  # idle: sleep until a message arrives
        while conn.poll(0):
            msg = conn.recv()
            if isinstance(msg, Shutdown):
                engine.close()
                return
            if isinstance(msg, AddRequest):
                try:
                    engine.add_request(msg.request_id, msg.prompt, msg.params,
                                       namespace=msg.namespace)
                except InvalidRequestError as e:
                    conn.send(RequestFailed(msg.request_id, str(e), e.param, e.kind))
                except Exception as e:  # a bug must fail this request only
                    log.exception("add_request failed")
                    engine.abort(msg.request_id)
                    conn.send(RequestFailed(msg.request_id, f"internal engine error: {e}",
                                            kind=ErrorKind.ENGINE_FAILURE))
            elif isinstance(msg, Abort):
                engine.abort(msg.request_id)
            elif isinstance(msg, GetStats):
                try:
                    conn.send(Stats(engine.stats()))
                except Exception as e:  # a stats bug must not take the engine down
                    log.exception("engine stats failed")
                    conn.send(StatsFailed(f"engine stats failed: {type(e).__name__}: {e}"))
        if engine.has_unfinished():
            try:
                outs = engine.step()
            except Exception as e:  # a bug must not take the process down with every request
                log.exception("engine step failed; failing the requests in flight")
                for rid in list(engine.requests):
                    engine.abort(rid)
                    conn.send(RequestFailed(rid, f"internal engine error: {e}",
                                            kind=ErrorKind.ENGINE_FAILURE))
                engine.step()  # collect the aborts
                continue
            if outs:
                conn.send(Outputs(outs))
