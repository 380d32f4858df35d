"""What the routes share: the engine process, the tokenizer, the up-front grammar compiler,
metrics, and the load state (``loading`` -> ``ready`` | ``failed``; a dead engine moves
``ready`` -> ``restarting`` -> ``ready``, or -> ``failed`` when its restart budget is spent)."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from grammarserve.engine.liveness import process_gone
from grammarserve.engine.memory_plan import MemoryPlan
from grammarserve.engine.process import EngineProcess
from grammarserve.engine.streams import AsyncRequestStream
from grammarserve.errors import EngineDeadError
from grammarserve.fsm import GrammarCompiler
from grammarserve.openai.context import ModelContext
from grammarserve.sampling_params import SamplingParams
from grammarserve.server.config import ServerConfig
from grammarserve.server.metrics import ServerMetrics
from grammarserve.server.supervisor import EngineSupervisor

log = logging.getLogger(__name__)


def crash_journal_folder(config: ServerConfig) -> Path:
    """Where the engine journals its grammar compiles (``fsm/crash_journal.py``): under the data
    folder when one is set (the constraints that crashed the engine stay refused across
    restarts of the server), else a folder of this server's own, removed at shutdown."""
    if config.data_dir is not None:
        return Path(config.data_dir) / "grammar-crashes"
    return Path(tempfile.gettempdir()) / f"grammarserve-crashes-{os.getpid()}-{uuid.uuid4().hex}"


class ServerState:
    """Loads the engine in the background so ``/health`` can answer 503 while it loads.

    It is the :class:`~grammarserve.openai.generation.EngineClient` of the routes and of the
    batch worker (``submit`` / ``abort``), and gives them the model's :attr:`context`."""

    def __init__(self, config: ServerConfig) -> None:
        self._own_journal = config.engine.grammar_crash_journal is None
        if self._own_journal:
            config = replace(config, engine=replace(
                config.engine, grammar_crash_journal=str(crash_journal_folder(config))))
        self.config = config
        self.metrics = ServerMetrics()
        self.status = "loading"
        self.error: str | None = None
        self.engine: EngineProcess | None = None
        self.tokenizer: Any = None
        self.compiler: GrammarCompiler | None = None
        self.context: ModelContext | None = None  # set when ready
        self.max_model_len = 0
        self.model_name = config.model_name()
        self.created = int(time.time())
        self.in_flight = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        self._supervisor: EngineSupervisor | None = None
        self._on_failure: Callable[[str], None] | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, on_failure: Callable[[str], None] | None = None) -> None:
        """Start loading on a background thread; ``on_failure(message)`` if it fails (or, later,
        if the engine keeps dying)."""
        self._on_failure = on_failure
        self._thread = threading.Thread(target=self._load, args=(on_failure,), daemon=True,
                                        name="grammarserve-load")
        self._thread.start()

    def _load(self, on_failure: Callable[[str], None] | None) -> None:
        # NOTE: the tokenizer and the validation compiler load here while the engine process
        # loads the model; a GGUF converted by both at once is safe (atomic rename).
        engine_box: list[EngineProcess | BaseException] = []
        starter = threading.Thread(target=self._start_engine, args=(engine_box,), daemon=True,
                                   name="grammarserve-engine-start")
        try:
            t0 = time.perf_counter()
            starter.start()
            tokenizer, compiler = self._load_grammar()
            starter.join()
            engine = engine_box[0]
            if isinstance(engine, BaseException):
                raise engine
            if self._closed:
                engine.shutdown()
                return
            self.engine = engine
            self.metrics.engine_pid = engine.pid
            info = engine.info
            self._ready(tokenizer, compiler, info)
            self._supervise(engine)
            plan = info.get("memory_plan")
            log.info("grammarserve ready: %s (KV %d tokens, context %d) in %.1fs%s",
                     self.model_name, info["kv_capacity"], self.max_model_len,
                     time.perf_counter() - t0,
                     f"; memory plan: {plan.describe()}" if isinstance(plan, MemoryPlan) else "")
        except Exception as e:  # reported through /health and on_failure
            starter.join()
            if engine_box and isinstance(engine_box[0], EngineProcess):
                engine_box[0].shutdown()
            self.status, self.error = "failed", str(e)
            log.error("grammarserve failed to start: %s", e)
            if on_failure is not None:
                on_failure(str(e))

    def _supervise(self, engine: EngineProcess) -> None:
        def down(reason: str) -> None:
            self.status, self.error = "restarting", reason
            dead = self.engine
            if dead is not None and dead.crashed_by_request:
                self.metrics.engine_request_crashes.inc()
            elif dead is not None and dead.stalled:
                self.metrics.engine_stalls.inc()

        def up(new: EngineProcess) -> None:
            self.engine = new
            self.metrics.engine_pid = new.pid
            self.metrics.engine_restarts.inc()
            self.status, self.error = "ready", None

        def give_up(reason: str) -> None:
            self.status, self.error = "failed", reason
            if self._on_failure is not None:
                self._on_failure(reason)

        self._supervisor = EngineSupervisor(engine, self._new_engine, self.config.restart,
                                            on_down=down, on_up=up, on_give_up=give_up)
        self._supervisor.start()

    def _ready(self, tokenizer: Any, compiler: GrammarCompiler, info: dict[str, Any]) -> None:
        """Serve with this tokenizer and compiler for the engine that sent ``info``."""
        self.tokenizer, self.compiler = tokenizer, compiler
        self.max_model_len = int(info["max_model_len"])
        self.model_name = self.config.model_name(info["model_folder"])
        self.context = ModelContext.create(
            tokenizer, compiler, max_model_len=self.max_model_len, max_n=self.config.max_n,
            model_name=self.model_name, tool_call_format=self.config.engine.tool_call_format,
            reasoning_parser=self.config.engine.reasoning_parser,
            strict_thinking=self.config.engine.strict_thinking,
            tool_call_parser=self.config.engine.tool_call_parser,
            max_prompt_chars=self.config.max_prompt_chars,
            max_choices=self.config.request_choices_limit, vocab_size=int(info["vocab_size"]))
        self.status = "ready"

    def _new_engine(self) -> EngineProcess:
        r = self.config.restart
        return EngineProcess(self.config.engine, startup_timeout_s=self.config.startup_timeout_s,
                             stall_timeout_s=r.stall_timeout_s, step_timeout_s=r.step_timeout_s)

    def _start_engine(self, box: list[EngineProcess | BaseException]) -> None:
        try:
            box.append(self._new_engine())
        except BaseException as e:  # re-raised by _load
            box.append(e)

    def _load_grammar(self) -> tuple[Any, GrammarCompiler]:
        """The tokenizer and the compiler whose front end checks constraints up front (the
        engine process compiles them; no backend is built here)."""
        from grammarserve.models.config import ModelConfig
        from grammarserve.models.loader import load_tokenizer, resolve_model_folder

        e = self.config.engine
        folder = resolve_model_folder(e.model, e.cache_dir)
        tokenizer = load_tokenizer(folder, e.chat_template)
        compiler = GrammarCompiler(tokenizer, **e.grammar_options,
                                   vocab_size=ModelConfig.from_folder(folder).vocab_size)
        return tokenizer, compiler

    def shutdown(self) -> None:
        self._closed = True
        if self._supervisor is not None:
            self._supervisor.stop()
        if self.engine is not None:
            self.engine.shutdown()
        if self._own_journal and self.config.data_dir is None:
            shutil.rmtree(str(self.config.engine.grammar_crash_journal), ignore_errors=True)

    @property
    def ready(self) -> bool:
        return self.status == "ready" and self.engine is not None and self.engine.alive

    @property
    def failed(self) -> bool:
        """The engine failed to load (it will not become ready)."""
        return self.status == "failed"

    @property
    def restarting(self) -> bool:
        """The engine died and is (about to be) restarted."""
        return self.status == "restarting" or (self.status == "ready" and not self.ready)

    @property
    def timings(self) -> ServerMetrics:
        """The latency histograms engine requests are timed into."""
        return self.metrics

    def require_context(self) -> ModelContext:
        """The model context, or :class:`EngineDeadError` (503) while loading or after a
        crash."""
        self.require_engine()
        assert self.context is not None  # set before status is "ready"
        return self.context

    def health(self) -> tuple[int, dict[str, Any]]:
        """``/health``: 200 only while the engine makes progress (answers at once, whatever
        the engine is doing)."""
        if self.ready and self.engine is not None and process_gone(self.engine.pid):
            return 503, {"status": "restarting", "message": "the engine process died"}
        trouble = self.engine.trouble() if self.ready and self.engine is not None else None
        if trouble is not None:
            return 503, {"status": "unavailable", "message": trouble}
        if self.ready:
            return 200, {"status": "ok"}
        if self.status == "loading":
            return 503, {"status": "loading", "message": "Loading model"}
        if self.restarting:
            return 503, {"status": "restarting",
                         "message": self.error or "the engine process died; restarting"}
        reason = self.error or "the engine process is not running"
        return 503, {"status": "error", "message": reason}

    def require_engine(self) -> EngineProcess:
        """The engine, or :class:`EngineDeadError` (503) while loading or after a crash."""
        if self.status == "loading":
            raise EngineDeadError("the model is still loading; retry shortly")
        if self.restarting:
            raise EngineDeadError(self.error or "the engine process died; restarting it")
        if not self.ready or self.engine is None:
            raise EngineDeadError(self.error or "the engine process is not running")
        return self.engine

    # -- requests --------------------------------------------------------------------------
    def try_reserve(self, n: int) -> bool:
        """Count ``n`` engine requests in flight, unless that would exceed the limit."""
        if self.in_flight + n > self.config.max_pending_requests:
            return False
        self.in_flight += n
        self.metrics.in_flight.set(self.in_flight)
        return True

    def release(self, n: int) -> None:
        self.in_flight -= n
        self.metrics.in_flight.set(self.in_flight)

    def submit(self, request_id: str, prompt: list[int], params: SamplingParams,
               namespace: str) -> AsyncRequestStream:
        return self.require_engine().add_request_async(request_id, prompt, params,
                                                       namespace=namespace)

    def abort(self, request_id: str) -> None:
        if self.engine is not None:
            try:
                self.engine.abort(request_id)
            except EngineDeadError:
                pass
