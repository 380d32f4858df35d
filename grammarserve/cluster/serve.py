"""The Ray Serve application: the OpenAI routes as the ingress, N engine replicas behind the
prefix- and grammar-aware router (``grammarserve serve --ray``).

Python::

    import ray
    from ray import serve
    from grammarserve.cluster.serve import RayServeConfig, build_app
    from grammarserve.server.config import ServerConfig

    ray.init()  # or ray.init(address="auto") on a cluster
    serve.start(http_options={"host": "127.0.0.1", "port": 8000})
    serve.run(build_app(RayServeConfig(ServerConfig(), replicas=2)), name="grammarserve",
              route_prefix="/")
    # ... http://127.0.0.1:8000/v1/chat/completions ...
    serve.delete("grammarserve")
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig

from grammarserve.cluster.ingress import Ingress
from grammarserve.cluster.replica import EngineReplica
from grammarserve.cluster.router import POLICIES, RouterConfig
from grammarserve.errors import InvalidRequestError
from grammarserve.server.config import ServerConfig

APP_NAME = "grammarserve"
#: Ray Serve imports the router by name in the ingress process.
ROUTER_CLASS = "grammarserve.cluster.ray_router.GrammarRequestRouter"


@dataclass(frozen=True)
class RayServeConfig:
    """The Ray Serve application.

    Parameters
    ----------
    server:
        The server's configuration (the engine's inside it is each replica's).
    replicas:
        Engine replicas (each loads the model and has its own caches).
    router:
        ``prefix_grammar`` (ours), ``power_of_two`` or ``round_robin``.
    router_config:
        How ``prefix_grammar`` keys and bounds load.
    replica_cpus:
        CPUs Ray reserves for each replica (the engine's threads run on them).
    max_ongoing_requests:
        Engine requests one replica takes at once (beyond, Ray queues them at the ingress).
    health_period_s:
        How often Ray checks each replica's engine, and the ingress reads their stats.
    """

    server: ServerConfig = field(default_factory=ServerConfig)
    replicas: int = 1
    router: str = "prefix_grammar"
    router_config: RouterConfig = field(default_factory=RouterConfig)
    replica_cpus: float = 1.0
    max_ongoing_requests: int = 64
    health_period_s: float = 5.0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise InvalidRequestError("replicas must be >= 1", param="replicas")
        if self.router not in POLICIES:
            raise InvalidRequestError(f"unknown router {self.router!r}; use one of "
                                      f"{sorted(POLICIES)}", param="router")


def build_app(config: RayServeConfig) -> Any:
    """The Serve application (``serve.run(build_app(...))``): the ingress bound to the engine
    deployment."""
    router_kwargs: dict[str, Any] = {"policy": config.router}
    if config.router == "prefix_grammar":
        c = config.router_config
        router_kwargs.update(block_tokens=c.block_tokens, max_blocks=c.max_blocks,
                             queue_threshold=c.queue_threshold, load_factor=c.load_factor)
    engine = serve.deployment(
        name="EngineReplica", num_replicas=config.replicas,
        max_ongoing_requests=config.max_ongoing_requests,
        health_check_period_s=config.health_period_s,
        ray_actor_options={"num_cpus": config.replica_cpus},
        # NOTE: mypy reads Ray's pydantic field types wrong (a str is what Ray documents).
        request_router_config=RequestRouterConfig(
            request_router_class=ROUTER_CLASS,  # type: ignore[arg-type]
            request_router_kwargs=router_kwargs),
    )(EngineReplica).bind(config.server.engine, config.server.startup_timeout_s)
    ingress = serve.deployment(name="Ingress", num_replicas=1,
                               ray_actor_options={"num_cpus": 0},
                               max_ongoing_requests=config.server.max_pending_requests)(Ingress)
    return ingress.bind(engine, config.server, config.replicas, config.health_period_s)


def run(config: RayServeConfig, *, address: str | None, host: str, port: int) -> None:
    """``grammarserve serve --ray``: join the Ray cluster at ``address`` (None: start a local
    one), serve the application on ``host:port`` until interrupted, then delete it."""
    import signal

    import ray

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)  # a plain kill also deletes the app and stops Ray
    ray.init(address=address)
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(build_app(config), name=APP_NAME, route_prefix="/", blocking=False)
        while True:
            time.sleep(3600)
    finally:
        try:
            serve.delete(APP_NAME)
        finally:
            ray.shutdown()
