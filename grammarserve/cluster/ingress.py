"""The ingress side of the Ray Serve application: the server's routes (one FastAPI app, the same
as ``grammarserve serve``) over engine replicas instead of one engine process.

:class:`RayEngine` gives the server's state what it uses of an engine process (submit as an
async stream, abort, stats) over a Serve deployment handle; Ray Serve routes each call with
:class:`~grammarserve.cluster.ray_router.GrammarRequestRouter`. :class:`RayServerState` is the
server state whose engine that is: ``/metrics`` sums the replicas' counters and labels each
replica's own, ``/health`` counts the replicas that answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from ray import serve
from ray.exceptions import RayError, RayTaskError

from grammarserve.engine.stats import EngineStats
from grammarserve.engine.streams import AsyncRequestStream
from grammarserve.errors import EngineDeadError, GrammarserveError
from grammarserve.sampling_params import SamplingParams
from grammarserve.server.config import ServerConfig
from grammarserve.server.metrics import PREFIX
from grammarserve.server.state import ServerState
from grammarserve.source_paths import drop_source_root

log = logging.getLogger(__name__)

#: Seconds before a request lost with its replica is sent again.
RETRY_DELAY_S = 2.0
#: Per-replica series exported on the ingress (besides the summed engine counters).
_REPLICA_FIELDS = ("finished_requests", "running_requests", "waiting_requests", "prompt_tokens",
                   "cached_prompt_tokens", "grammar_cache_hits", "grammar_cache_misses")


def as_error(e: BaseException) -> BaseException:
    """An exception from a replica call as the error the API answers with: the replica's own
    error (a bad request, an engine failure), or :class:`EngineDeadError` (503) when the
    replica or its engine is gone."""
    if isinstance(e, RayTaskError):
        cause = e.cause if isinstance(e.cause, BaseException) else None
        if isinstance(cause, GrammarserveError):
            return cause
        if cause is not None and not isinstance(cause, RayError):
            return GrammarserveError(f"engine replica failed: {type(cause).__name__}: {cause}")
    if isinstance(e, GrammarserveError):
        return e
    return EngineDeadError(f"the engine replica is gone ({type(e).__name__}); retry shortly")


def sum_stats(snapshots: list[dict[str, Any]]) -> EngineStats | None:
    """The replicas' engine counters added up (None without any)."""
    if not snapshots:
        return None
    total: dict[str, Any] = {}
    for s in snapshots:
        for name, value in s["engine"].items():
            total[name] = total.get(name, 0) + value
    names = {f.name for f in dataclasses.fields(EngineStats)}
    return EngineStats(**{k: v for k, v in total.items() if k in names})


class RayEngine:
    """The engine replicas behind a Serve deployment handle, as :class:`ServerState` uses an
    :class:`~grammarserve.engine.process.EngineProcess`.

    A request whose replica dies before it produced any output is sent once more (Serve routes
    it to a live replica; ``retried`` counts these, exported as
    ``grammarserve_replica_retried_requests_total``); one that had produced output ends with
    :class:`EngineDeadError` (a 503, or an error event in a stream that had begun).
    """

    def __init__(self, handle: Any, info: dict[str, Any]) -> None:
        self.handle = handle
        self.info = info
        self.pid: int | None = None  # no local engine process
        self.alive = True  # Ray replaces dead replicas; health() counts the live ones
        self.replicas: list[dict[str, Any]] = []  # the last stats of each replica
        self.retried = 0  # requests sent again: their replica died before their first output
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def add_request_async(self, request_id: str, prompt: str | list[int],
                          params: SamplingParams, *, namespace: str = ""
                          ) -> AsyncRequestStream:
        stream = AsyncRequestStream(request_id, asyncio.get_running_loop())
        task = asyncio.ensure_future(self._pump(stream, prompt, params, namespace))
        self._tasks[request_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(request_id, None))
        return stream

    async def _pump(self, stream: AsyncRequestStream, prompt: str | list[int],
                    params: SamplingParams, namespace: str) -> None:
        for attempt in range(2):
            delivered = False
            call = self.handle.options(stream=True).generate.remote(
                stream.request_id, prompt, params, namespace)
            try:
                async for out in call:
                    delivered = True
                    stream.put(out)
                return
            except asyncio.CancelledError:
                call.cancel()
                raise
            except Exception as e:  # noqa: BLE001 - delivered to the stream's reader
                err = as_error(e)
                if isinstance(err, EngineDeadError) and not delivered and attempt == 0:
                    log.warning("engine replica lost request %s before its first output; "
                                "retrying it once", stream.request_id)
                    self.retried += 1
                    # NOTE: the dead replica's process exits within a second; by then Serve
                    # routes around it (the same key would pick it again before).
                    await asyncio.sleep(RETRY_DELAY_S)
                    continue
                stream.put(err)
                return

    def abort(self, request_id: str) -> None:
        """Cancel the request's call (its replica aborts the engine request)."""
        task = self._tasks.get(request_id)
        if task is not None:
            task.cancel()

    async def replica_stats(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Each live replica's :meth:`~grammarserve.cluster.replica.EngineReplica.stats`
        (replicas that do not answer are left out)."""
        results = await self.handle.broadcast("stats").results_async(
            timeout_s=timeout, return_exceptions=True)
        self.replicas = [r for r in results if isinstance(r, dict)]
        return self.replicas

    def poll_replicas(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        """:meth:`replica_stats` from a thread that runs no event loop."""
        results = self.handle.broadcast("stats").results(timeout_s=timeout,
                                                         return_exceptions=True)
        self.replicas = [r for r in results if isinstance(r, dict)]
        return self.replicas

    async def stats_async(self, timeout: float = 30.0) -> EngineStats:
        stats = sum_stats(await self.replica_stats(timeout))
        if stats is None:
            raise EngineDeadError("no engine replica answered")
        return stats

    async def recent_stats(self, wait_s: float = 0.5) -> EngineStats | None:
        """The replicas' summed counters (each replica answers from its engine's newest
        published ones), or None when none answers within a few seconds."""
        try:
            return await self.stats_async(timeout=max(wait_s, 5.0))
        except (GrammarserveError, TimeoutError):
            return None

    def trouble(self) -> str | None:
        """Never from here: Ray replaces dead replicas, and ``health`` counts the live ones."""
        return None

    def shutdown(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()


class _ReplicaCollector(Collector):
    """Per-replica series (label ``replica``) from the last stats the ingress read, and the
    requests it sent again after their replica died."""

    def __init__(self, engine: Callable[[], RayEngine | None]) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        engine = self.engine()
        snapshots = engine.replicas if engine is not None else []
        retried = CounterMetricFamily(f"{PREFIX}_replica_retried_requests",
                                      "Engine requests sent again because their replica died "
                                      "before their first output")
        retried.add_metric([], engine.retried if engine is not None else 0)
        yield retried
        ready = GaugeMetricFamily(f"{PREFIX}_replicas_ready",
                                  "Engine replicas that answered the last stats call")
        ready.add_metric([], len(snapshots))
        yield ready
        served = CounterMetricFamily(f"{PREFIX}_replica_served_requests",
                                     "Engine requests a replica finished", labels=["replica"])
        for s in snapshots:
            served.add_metric([s["replica"]], s["served"])
        yield served
        for name in _REPLICA_FIELDS:
            family = GaugeMetricFamily(f"{PREFIX}_replica_{name}",
                                       f"engine statistic {name} of each replica",
                                       labels=["replica"])
            for s in snapshots:
                family.add_metric([s["replica"]], s["engine"][name])
            yield family


class RayServerState(ServerState):
    """The server state of the Ray ingress: the tokenizer and the up-front grammar compiler
    load here, the engines are the replicas behind ``handle``."""

    def __init__(self, config: ServerConfig, handle: Any, *, expected_replicas: int,
                 health_period_s: float = 5.0) -> None:
        super().__init__(config)
        self.handle = handle
        self.expected_replicas = expected_replicas
        self.health_period_s = health_period_s
        self.ray_engine: RayEngine | None = None
        self._stop = threading.Event()
        self.metrics.registry.register(_ReplicaCollector(lambda: self.ray_engine))

    def _load(self, on_failure: Callable[[str], None] | None) -> None:
        try:
            t0 = time.perf_counter()
            tokenizer, compiler = self._load_grammar()
            # NOTE: a plain call through the router: it waits until some replica is up.
            info = self.handle.info.remote().result(timeout_s=self.config.startup_timeout_s)
            if self._closed:
                return
            engine = RayEngine(self.handle, info)
            engine.poll_replicas(timeout=self.config.startup_timeout_s)
            self.ray_engine = engine
            # NOTE: the routes call the same methods on it as on an EngineProcess.
            self.engine = engine  # type: ignore[assignment]
            self._ready(tokenizer, compiler, info)
            threading.Thread(target=self._poll, daemon=True,
                             name="grammarserve-replica-poll").start()
            log.info("grammarserve on Ray ready: %s in %.1fs", self.model_name,
                     time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001 - reported through /health and on_failure
            self.status, self.error = "failed", str(e)
            log.error("grammarserve on Ray failed to start: %s", e)
            if on_failure is not None:
                on_failure(str(e))

    def health(self) -> tuple[int, dict[str, Any]]:
        status, body = super().health()
        if status != 200 or self.ray_engine is None:
            return status, body
        live = len(self.ray_engine.replicas)
        body = {"status": "ok" if live else "error", "replicas_ready": live,
                "replicas": self.expected_replicas}
        if not live:
            body["message"] = "no engine replica answered its last stats call"
        return (200 if live else 503), body

    def _poll(self) -> None:
        """Read every replica's stats each ``health_period_s`` (``/health`` reports the last
        reading; ``/metrics`` reads them afresh)."""
        while not self._stop.wait(self.health_period_s):
            if self.ray_engine is None:
                continue
            try:
                self.ray_engine.poll_replicas(timeout=self.health_period_s * 2)
            except Exception as e:  # noqa: BLE001 - no replica answered (gone, or deleting)
                self.ray_engine.replicas = []
                log.warning("no replica stats: %s", e)

    def shutdown(self) -> None:
        self._closed = True
        self._stop.set()
        if self.ray_engine is not None:
            self.ray_engine.shutdown()


@serve.ingress()
class Ingress:
    """The Serve ingress deployment: the server's app over a :class:`RayServerState`."""

    def __init__(self, engine: Any, config: ServerConfig, replicas: int,
                 health_period_s: float = 5.0) -> None:
        drop_source_root(sys.path)  # before the app loads the tokenizer
        self.state = RayServerState(config, engine, expected_replicas=replicas,
                                    health_period_s=health_period_s)

    def __serve_build_asgi_app__(self) -> Any:
        from grammarserve.server.app import create_app

        return create_app(self.state.config, state=self.state)
