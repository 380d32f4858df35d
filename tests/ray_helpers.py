"""A local Ray instance for the cluster tests, made to start on a loaded 2-core machine."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

#: Ray's own settings, through the environment its local processes inherit from ray.init:
#: workers run at nice 0 (Ray's default, 15, starves the engine replicas beside any busy
#: process: their start took over 8 minutes beside two busy loops), and Serve waits 120 s
#: for its HTTP proxy (its 5 s ready check killed a proxy still starting there).
RAY_ENV = {"RAY_worker_niceness": "0",
           "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "120",
           "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "120"}


@contextmanager
def local_ray() -> Iterator[None]:
    """``ray.init`` of a small local instance (2 CPUs, 200 MiB object store), shut down on exit."""
    ray = pytest.importorskip("ray")
    with pytest.MonkeyPatch.context() as env:
        for name, value in RAY_ENV.items():
            env.setenv(name, value)
        ray.init(num_cpus=2, object_store_memory=200 * 2**20, include_dashboard=False,
                 log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
