"""The server's side of an engine running in its own process (:mod:`.process_child` is the
other side; :mod:`.process_messages` the protocol).

Callers submit requests and read each one's outputs from a stream: blocking callers iterate a
:class:`RequestStream`; asyncio callers (the server) use :meth:`EngineProcess.add_request_async`,
whose :class:`AsyncRequestStream` is fed from the reader thread. Nothing here blocks a caller
on the engine: messages go out through a sender thread's queue.

Every engine death is seen, and every caller waiting on the engine is answered
(:class:`EngineDeadError`, a 503) when it happens:

the process ends (its sentinel: ``waitpid``, not only EOF on the pipe); it stops making
progress (:mod:`.progress`: it is killed and that counts as its death); or the reader thread
fails past its per-message guard (the engine is killed: nobody would deliver its outputs).
A native crash (:data:`NATIVE_CRASH_SIGNALS`) while a constraint compiled (the crash journal,
``fsm/crash_journal.py``) is that constraint's: its requests get a 400 and the death is
:attr:`EngineProcess.crashed_by_request`.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import queue
import signal
import threading
from concurrent.futures import Future
from multiprocessing.connection import wait
from typing import Any, TypeVar

from grammarserve.config import EngineConfig
from grammarserve.engine.process_child import engine_main
from grammarserve.engine.process_messages import (
    Abort,
    AddRequest,
    GetStats,
    Heartbeat,
    Outputs,
    Published,
    RequestFailed,
    Shutdown,
    StartupFailed,
    Stats,
    StatsFailed,
)
from grammarserve.engine.progress import STALL_TIMEOUT_S, STEP_TIMEOUT_S, ProgressWatch
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

#: Exit signals of a native crash (the journal blames the compiles then running on them).
NATIVE_CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE,
                                  signal.SIGABRT})
_STOP = object()  # tells the sender thread to end


class EngineProcess:
    """Client side of an engine running in a child process (spawned, so CUDA-safe).

    ``stall_timeout_s``: seconds without a heartbeat after which the engine counts as stuck
    and is killed; ``step_timeout_s``: the longest one step may run before the same."""

    def __init__(self, config: EngineConfig, *, startup_timeout_s: float = 900.0,
                 stall_timeout_s: float = STALL_TIMEOUT_S,
                 step_timeout_s: float = STEP_TIMEOUT_S) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=engine_main, args=(config, child), daemon=True,
                                 name="grammarserve-engine")
        self._proc.start()
        child.close()
        self.progress = ProgressWatch(stall_timeout_s, step_timeout_s)
        self._lock = threading.Lock()  # streams, digests, stats waiters and the death
        self._streams: dict[str, RequestStream] = {}
        self._stats_waiters: list[Future[EngineStats]] = []  # answered in the order asked
        self._dead: EngineDeadError | None = None
        self._died = threading.Event()  # set once, when the process is found gone
        self._kill_reason: str | None = None  # set when this client killed a stuck engine
        folder = config.grammar_crash_journal
        self._journal = CrashJournal(folder) if folder is not None else None
        self._digests: dict[str, str] = {}  # request id -> its constraint's journal digest
        self.crashed_by_request = False  # set at death: a native crash while compiling
        self.latest_stats: EngineStats | None = None  # the newest counters the engine sent
        self.reader_errors = 0  # messages the reader could not deliver (each logged)
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
        self.progress.on_message(first)
        self._outbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._sender = threading.Thread(target=self._send_loop, daemon=True,
                                        name="grammarserve-engine-sender")
        self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                        name="grammarserve-engine-reader")
        self._sender.start()
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self._dead is None and self._proc.is_alive()

    @property
    def exitcode(self) -> int | None:
        """The process's exit code once it ended (negative: killed by that signal)."""
        return self._proc.exitcode

    @property
    def pid(self) -> int | None:
        """The engine process's id (to signal it; None before it started)."""
        return self._proc.pid

    @property
    def stalled(self) -> bool:
        """This client killed the engine because it stopped making progress."""
        return self._kill_reason is not None

    def wait_dead(self, timeout: float | None = None) -> bool:
        """Block until the engine process is found gone (crash, kill, stall or shutdown);
        False if ``timeout`` passed first. Callers waiting on it have already been failed."""
        return self._died.wait(timeout)

    def trouble(self) -> str | None:
        """Why the engine cannot serve now (dead, stopped, silent, its reader gone), or None
        when it is making progress. Answers at once, whatever the engine is doing."""
        if self._dead is not None:
            return str(self._dead)
        if not self._reader.is_alive() or not self._sender.is_alive():
            return "the engine client's threads ended"
        return self.progress.trouble(self.pid)

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
        spec = params.constraint.prepared if params.constraint is not None else None
        digest = (spec_digest(spec) if self._journal is not None and isinstance(spec, GrammarSpec)
                  else None)
        with self._lock:
            if self._dead is not None:
                raise self._dead
            if request_id in self._streams:
                raise InvalidRequestError(f"request id {request_id!r} is already in use",
                                          param="request_id")
            self._streams[request_id] = stream
            if digest is not None:
                self._digests[request_id] = digest
        self._outbox.put(AddRequest(request_id, prompt, params, namespace))
        return stream

    def abort(self, request_id: str) -> None:
        if request_id in self._streams and self._dead is None:
            self._outbox.put(Abort(request_id))

    def stats(self, timeout: float = 30.0) -> EngineStats:
        """The engine's counters now (asked; waits for the engine's current step)."""
        return self._request_stats().result(timeout=timeout)

    async def stats_async(self, timeout: float = 30.0) -> EngineStats:
        """:meth:`stats` without blocking the event loop."""
        return await asyncio.wait_for(asyncio.wrap_future(self._request_stats()), timeout)

    async def recent_stats(self, wait_s: float = 0.5) -> EngineStats | None:
        """Fresh counters if the engine answers within ``wait_s``, else the newest it sent
        (None before any): a long step never holds up the caller longer than ``wait_s``."""
        try:
            return await self.stats_async(timeout=wait_s)
        except (GrammarserveError, TimeoutError):
            return self.latest_stats

    def _request_stats(self) -> Future[EngineStats]:
        fut: Future[EngineStats] = Future()
        with self._lock:
            if self._dead is not None:
                fut.set_exception(self._dead)
                return fut
            self._stats_waiters.append(fut)
            self._outbox.put(GetStats())  # NOTE: under the lock: answers come in this order
        return fut

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine process (pending requests end with EngineDeadError)."""
        if self._proc.is_alive():
            self._outbox.put(Shutdown())
            self._proc.join(timeout)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(timeout)
        self._outbox.put(_STOP)

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- the sender and reader threads ------------------------------------------------------
    def _send_loop(self) -> None:
        while True:
            msg = self._outbox.get()
            if msg is _STOP:
                return
            try:
                self._conn.send(msg)
            except (OSError, ValueError) as e:  # the pipe broke: the process is gone
                if self._dead is None:
                    self._kill(f"the engine pipe failed: {e}")
                return
            except Exception as e:  # an unpicklable message fails its request
                log.exception("could not send %s to the engine", type(msg).__name__)
                if isinstance(msg, AddRequest):
                    self._fail_one(msg.request_id, RequestFailedError(
                        f"could not send the request to the engine: {e}",
                        kind=ErrorKind.ENGINE_FAILURE))

    def _read_loop(self) -> None:
        try:
            self._watch()
        except BaseException as e:  # no reader: nobody would deliver outputs
            log.exception("the engine reader failed; killing the engine")
            self._kill(f"the engine reader failed: {type(e).__name__}: {e}")
            self._proc.join(5)
            self._fail_all(EngineDeadError(self._kill_reason or "the engine reader failed"),
                           blame=False)

    def _watch(self) -> None:
        sentinel = self._proc.sentinel
        while True:
            ready = wait([self._conn, sentinel], timeout=1.0)
            if self._conn in ready:
                try:
                    msg = self._conn.recv()
                except (EOFError, OSError):
                    self._ended()
                    return
                self.progress.on_message(msg)
                self._guarded(msg)
            elif sentinel in ready:
                self._drain()
                self._ended()
                return
            overdue = self.progress.overdue(self.pid)
            if overdue is not None:
                self._kill(overdue)

    def _guarded(self, msg: object) -> None:
        try:
            self._deliver(msg)
        except Exception:  # one message must not stop the delivery of others
            self.reader_errors += 1
            log.exception("could not deliver the engine's %s", type(msg).__name__)

    def _drain(self) -> None:
        """Deliver what the dead process wrote before it ended."""
        try:
            while self._conn.poll(0):
                self._guarded(self._conn.recv())
        except (EOFError, OSError):
            pass

    def _deliver(self, msg: object) -> None:
        if isinstance(msg, Heartbeat):
            pass  # noted by the progress watch
        elif isinstance(msg, Outputs):
            for out in msg.outputs:
                stream = self._streams.get(out.request_id)
                if stream is None:
                    continue
                if out.finished:
                    with self._lock:
                        self._streams.pop(out.request_id, None)
                        self._digests.pop(out.request_id, None)
                try:
                    stream.put(out)
                except Exception:  # one stream's failure is not the others'
                    self.reader_errors += 1
                    log.exception("could not deliver an output of %s", out.request_id)
        elif isinstance(msg, RequestFailed):
            self._fail_one(msg.request_id, RequestFailedError(
                msg.message, kind=msg.kind, param=msg.param)
                if msg.kind is ErrorKind.ENGINE_FAILURE else
                InvalidRequestError(msg.message, param=msg.param, kind=msg.kind))
        elif isinstance(msg, Published):
            self.latest_stats = msg.stats
        elif isinstance(msg, (Stats, StatsFailed)):
            with self._lock:
                waiter = self._stats_waiters.pop(0) if self._stats_waiters else None
            if isinstance(msg, Stats):
                self.latest_stats = msg.stats
            # NOTE: a caller that gave up (a long step) cancelled its future: drop the answer
            if waiter is not None and waiter.set_running_or_notify_cancel():
                if isinstance(msg, Stats):
                    waiter.set_result(msg.stats)
                else:
                    waiter.set_exception(GrammarserveError(msg.message))
        else:
            raise TypeError(f"unknown message from the engine: {type(msg).__name__}")

    def _fail_one(self, request_id: str, err: BaseException) -> None:
        with self._lock:
            self._digests.pop(request_id, None)
            stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.put(err)

    def _kill(self, reason: str) -> None:
        with self._lock:
            if self._kill_reason is not None or not self._proc.is_alive():
                return
            self._kill_reason = reason
        log.error("%s", reason)
        pid = self.pid
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _ended(self) -> None:
        self._proc.join(5)
        code = self._proc.exitcode
        native = (self._kill_reason is None and code is not None and code < 0
                  and -code in NATIVE_CRASH_SIGNALS)
        reason = self._kill_reason or f"the engine process died (exit code {code})"
        self._fail_all(EngineDeadError(reason), blame=native)

    def _fail_all(self, err: EngineDeadError, *, blame: bool) -> None:
        """Answer every waiting caller (``blame``: a native crash, which the compiles then
        running are blamed for); whatever fails here, the death is still marked."""
        with self._lock:
            if self._dead is None:
                self._dead = err
            streams, self._streams = self._streams, {}
            digests, self._digests = self._digests, {}
            waiters, self._stats_waiters = self._stats_waiters, []
        try:
            crashed = self._collect_crashes() if blame else set()
            for request_id, stream in streams.items():
                if digests.get(request_id) in crashed:
                    stream.put(InvalidRequestError(CRASHED_MESSAGE, param="response_format",
                                                   kind=ErrorKind.CONSTRAINT_INVALID))
                else:
                    stream.put(err)
            for waiter in waiters:
                if waiter.set_running_or_notify_cancel():
                    waiter.set_exception(err)
        finally:
            self._outbox.put(_STOP)
            self._died.set()

    def _collect_crashes(self) -> set[str]:
        """The digests of the constraints that were compiling when the process died (moved to
        the journal's crashed list, which the next engine refuses)."""
        if self._journal is None:
            return set()
        try:
            found = set(self._journal.collect(self.pid))
        except Exception as e:  # a safety net must never hide the death
            log.warning("could not read the grammar crash journal: %s", e)
            return set()
        if found:
            self.crashed_by_request = True
            log.error("the engine died while compiling %d constraint(s); refusing them from now "
                      "on: %s", len(found), ", ".join(sorted(found)))
        return found
