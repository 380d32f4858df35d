"""The engine process's body: build the engine, then serve messages and step while there is
work (:mod:`grammarserve.engine.process_messages` names the protocol).

Two threads write the pipe, under one lock: the main thread (outputs, answers, published
counters) and the heartbeat thread, which runs whatever the main thread is doing (a long
prefill step included), so the parent can tell a busy engine from a stopped or wedged one.
The heartbeat also watches the process's resident memory: a growth of
:data:`MEMORY_JUMP_BYTES` or more between two beats is logged with the engine's load then
(what was running, compiling and cached), so a memory spike names its moment in the log.
The process ends when told to (``Shutdown``) or when the parent's end of the pipe closes.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import threading
import time
from multiprocessing.connection import Connection

from grammarserve.config import EngineConfig
from grammarserve.engine.engine import Engine
from grammarserve.engine.heap import HeapTrimmer, freeze_startup_heap
from grammarserve.engine.memory import process_rss_bytes
from grammarserve.engine.process_messages import (
    HEARTBEAT_S,
    PUBLISH_S,
    Abort,
    AddRequest,
    GetStats,
    Heartbeat,
    Outputs,
    Published,
    Ready,
    RequestFailed,
    Shutdown,
    StartupFailed,
    Stats,
    StatsFailed,
)
from grammarserve.errors import ErrorKind, GrammarserveError, InvalidRequestError

log = logging.getLogger(__name__)

#: A growth of resident memory between two heartbeats that is logged with the engine's load.
MEMORY_JUMP_BYTES = 512 << 20

_CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT)


class _Pipe:
    """The child's end of the pipe, safe to send on from several threads."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()
        self.steps = 0
        self.step_started: float | None = None  # monotonic start of the running step
        self.closed = threading.Event()

    def send(self, msg: object) -> None:
        with self._lock:
            self.conn.send(msg)

    def heartbeat_forever(self, engine: Engine) -> None:
        rss = process_rss_bytes()
        while not self.closed.wait(HEARTBEAT_S):
            started = self.step_started
            try:
                self.send(Heartbeat(self.steps, None if started is None
                                    else time.monotonic() - started))
            except (OSError, ValueError):  # the parent is gone: the main thread ends too
                self.closed.set()
            rss = _watch_memory(engine, rss, started)


def _watch_memory(engine: Engine, last: int, step_started: float | None) -> int:
    """Log a jump of resident memory since ``last`` with the engine's load; the RSS now."""
    now = process_rss_bytes()
    if now - last < MEMORY_JUMP_BYTES:
        return now
    try:  # NOTE: read beside the stepping thread; a torn read only spoils this log line
        s = engine.stats()
        load = (f"running {s.running_requests}, waiting {s.waiting_requests}, KV free "
                f"{s.kv_free} of {s.kv_capacity}, host tier {s.kv_host_tier_bytes >> 20} MiB, "
                f"grammars {s.grammar_cache_bytes >> 20} MiB, heap free "
                f"{s.heap_free_held_bytes >> 20} MiB")
    except Exception as e:  # noqa: BLE001 - diagnostics only
        load = f"load unknown ({type(e).__name__})"
    step = "idle" if step_started is None else \
        f"step running for {time.monotonic() - step_started:.1f} s"
    log.warning("engine memory grew %d MiB in %.0f s to %d MiB (%s; %s)",
                (now - last) >> 20, HEARTBEAT_S, now >> 20, step, load)
    return now


def engine_main(config: EngineConfig, conn: Connection) -> None:
    """Child process body (the target of ``EngineProcess``'s process)."""
    # NOTE: a spawned process starts with no logging set up: without this its start-up report
    # (the kernels, the memory plan) was dropped and its warnings printed bare.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("grammarserve").setLevel(logging.INFO)
    pipe = _Pipe(conn)
    try:
        engine = Engine(config)
    except Exception as e:  # reported to the parent, which raises it in the caller
        conn.send(StartupFailed(f"{type(e).__name__}: {e}" if not isinstance(
            e, GrammarserveError) else str(e)))
        return
    engine.warm_up()
    _plain_crashes()
    frozen = freeze_startup_heap()
    pipe.send(Ready({"kv_capacity": engine.runner.pool.capacity,
                     "kv_bytes_per_token": engine.kv_bytes_per_token,
                     "memory_plan": engine.memory_plan,
                     "rss_bytes": process_rss_bytes(), "model": config.model,
                     "model_folder": str(engine.loaded.folder),
                     "vocab_size": engine.vocab_size,
                     "stop_token_ids": sorted(engine.eos_ids),
                     "max_model_len": engine.max_model_len, "gc_frozen_objects": frozen}))
    threading.Thread(target=pipe.heartbeat_forever, args=(engine,), daemon=True,
                     name="grammarserve-heartbeat").start()
    try:
        _serve(engine, pipe)
    except (EOFError, OSError, ValueError):  # the parent went away: nobody to answer
        log.warning("the server's end of the engine pipe closed; the engine exits")
    finally:
        pipe.closed.set()
        engine.close()


def _plain_crashes() -> None:
    """A native crash ends the process at once, after Python's traceback of every thread
    (``faulthandler``, async-signal-safe). A library's own crash handler (tvm_ffi's, which
    xgrammar loads, symbolizes a backtrace) runs while the other threads go on, and in a
    crash inside a torch kernel it hung until the stall timeout killed the process."""
    for sig in _CRASH_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    faulthandler.enable(all_threads=True)


def _serve(engine: Engine, pipe: _Pipe) -> None:
    heap = HeapTrimmer()
    published = 0.0
    while True:
        heap.maybe_trim()
        if not engine.has_unfinished():  # idle: sleep until a message or the next trim
            pipe.conn.poll(heap.interval_s)
        while pipe.conn.poll(0):
            if not _handle(engine, pipe, pipe.conn.recv()):
                return
        if engine.has_unfinished():
            _step(engine, pipe)
            if time.monotonic() - published >= PUBLISH_S or not engine.has_unfinished():
                published = time.monotonic()
                _publish(engine, pipe)


def _handle(engine: Engine, pipe: _Pipe, msg: object) -> bool:
    """Act on one message from the parent; False on ``Shutdown``."""
    if isinstance(msg, Shutdown):
        return False
    if isinstance(msg, AddRequest):
        try:
            engine.add_request(msg.request_id, msg.prompt, msg.params, namespace=msg.namespace)
        except InvalidRequestError as e:
            pipe.send(RequestFailed(msg.request_id, str(e), e.param, e.kind))
        except Exception as e:  # a bug must fail this request only
            log.exception("add_request failed")
            engine.abort(msg.request_id)
            pipe.send(RequestFailed(msg.request_id, f"internal engine error: {e}",
                                    kind=ErrorKind.ENGINE_FAILURE))
    elif isinstance(msg, Abort):
        engine.abort(msg.request_id)
    elif isinstance(msg, GetStats):
        try:
            pipe.send(Stats(engine.stats()))
        except (OSError, ValueError):
            raise
        except Exception as e:  # a stats bug must not take the engine down
            log.exception("engine stats failed")
            pipe.send(StatsFailed(f"engine stats failed: {type(e).__name__}: {e}"))
    return True


def _step(engine: Engine, pipe: _Pipe) -> None:
    pipe.step_started = time.monotonic()
    try:
        outs = engine.step()
    except Exception as e:  # a bug must not take the process down with every request
        log.exception("engine step failed; failing the requests in flight")
        for rid in list(engine.requests):
            engine.abort(rid)
            pipe.send(RequestFailed(rid, f"internal engine error: {e}",
                                    kind=ErrorKind.ENGINE_FAILURE))
        engine.step()  # collect the aborts
        return
    finally:
        pipe.step_started = None
        pipe.steps += 1
    if outs:
        pipe.send(Outputs(outs))


def _publish(engine: Engine, pipe: _Pipe) -> None:
    try:
        stats = engine.stats()
    except Exception:  # the counters are a convenience; GetStats reports its own failure
        log.exception("engine stats failed")
        return
    pipe.send(Published(stats))
