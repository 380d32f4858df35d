"""One engine replica of the Ray Serve application: an :class:`EngineProcess` (its own KV pool,
radix cache and grammar cache) behind the methods the ingress calls.

The class is plain Python; :func:`grammarserve.cluster.serve.build_app` makes it a Serve
deployment. When its engine process dies, the requests it had in flight end with
:class:`~grammarserve.errors.EngineDeadError` and the replica's process exits, so Ray Serve stops
routing to it and starts a new replica.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from grammarserve.config import EngineConfig
from grammarserve.engine.process import EngineProcess
from grammarserve.engine.request import RequestOutput
from grammarserve.errors import EngineDeadError
from grammarserve.sampling_params import SamplingParams
from grammarserve.source_paths import drop_source_root

log = logging.getLogger(__name__)
#: Seconds between the engine's death and the replica's exit.
_EXIT_GRACE_S = 0.5


def _replica_id() -> str:
    """This replica's id within Serve (the process id outside a Serve replica)."""
    try:
        from ray import serve

        return str(serve.get_replica_context().replica_id.unique_id)
    except Exception:  # noqa: BLE001 - not inside a replica (a unit test)
        return f"pid-{os.getpid()}"


class EngineReplica:
    """An engine process and the calls the ingress makes on it.

    Parameters
    ----------
    config:
        The engine's configuration (each replica loads its own copy of the model).
    startup_timeout_s:
        How long the engine may take to load.
    """

    def __init__(self, config: EngineConfig, startup_timeout_s: float = 900.0) -> None:
        drop_source_root(sys.path)  # before the engine process copies it
        self.engine = EngineProcess(config, startup_timeout_s=startup_timeout_s)
        self.replica_id = _replica_id()
        self.received = 0  # generate calls begun here
        self.served = 0  # generate calls finished here (the router test counts them)
        self._closing = False
        threading.Thread(target=self._exit_with_engine, daemon=True,
                         name="grammarserve-replica-watch").start()

    def _exit_with_engine(self) -> None:
        """End this replica's process when its engine dies, so Ray routes around it at once
        and starts a new one (a health check would leave it routable for a period)."""
        self.engine.wait_dead()
        if self._closing:
            return
        time.sleep(_EXIT_GRACE_S)  # the failed requests' errors reach the ingress first
        log.error("replica %s: the engine process died (exit code %s); exiting so Ray "
                  "replaces this replica", self.replica_id, self.engine.exitcode)
        os._exit(1)

    async def generate(self, request_id: str, prompt: list[int], params: SamplingParams,
                       namespace: str) -> AsyncIterator[RequestOutput]:
        """The outputs of one engine request, as the engine produces them. Cancelling the call
        (the client went away) aborts the request."""
        self.received += 1
        stream = self.engine.add_request_async(request_id, prompt, params, namespace=namespace)
        finished = False
        try:
            async for out in stream:
                finished = out.finished
                yield out
        finally:
            if not finished:
                try:
                    self.engine.abort(request_id)
                except EngineDeadError:
                    pass
            self.served += 1

    async def stats(self) -> dict[str, Any]:
        """This replica's id, its engine's counters (``EngineStats`` as a dict) and how many
        requests it served."""
        # a long step holds this up at most 0.5 s (the newest published counters), unless the
        # engine has published none yet
        stats = await self.engine.recent_stats() or await self.engine.stats_async(timeout=10.0)
        return {"replica": self.replica_id, "engine": dataclasses.asdict(stats),
                "served": self.served}

    def counts(self) -> dict[str, Any]:
        """This replica's id, its engine process's id and its generate calls (``received``:
        begun here, ``served``: ended here), without asking the engine: they answer while the
        engine is busy, stopped or gone."""
        return {"replica": self.replica_id, "engine_pid": self.engine.pid,
                "received": self.received, "served": self.served}

    def info(self) -> dict[str, Any]:
        """The engine's start-up facts (model folder, context length, KV capacity) and the
        replica id."""
        return {**self.engine.info, "replica": self.replica_id}

    def check_health(self) -> None:
        """Raise when the engine process is gone (Serve then replaces this replica)."""
        if not self.engine.alive:
            raise EngineDeadError(f"the engine process of replica {self.replica_id} died "
                                  f"(exit code {self.engine.exitcode})")

    def __del__(self) -> None:
        self._closing = True
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()
