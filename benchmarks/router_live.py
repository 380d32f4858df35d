"""``bench_router.py --live``: the multi-tenant workload through the Ray Serve application with
real engine replicas of the embedded model, once per routing policy, on a local Ray instance.

Each request streams (TTFT measured at the client, first content or tool-call delta) and asks for
usage, whose ``cached_tokens`` gives the prefix cache hit rate; the grammar cache hit rate is the
replicas' engine counters (``/metrics``) over the run.
"""

from __future__ import annotations

import socket
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import router_workload as wl

GRAMMAR_COUNTERS = ("grammarserve_grammar_cache_hits", "grammarserve_grammar_cache_misses")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _counters(base: str) -> dict[str, float]:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{base}/metrics", timeout=60).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.removesuffix("_total") in GRAMMAR_COUNTERS and not sample.labels:
                out[sample.name.removesuffix("_total")] = sample.value
    return out


def _one(client: Any, t: int, j: int, max_tokens: int) -> dict[str, Any]:
    body = wl.chat_body(t, j, max_tokens=max_tokens)
    t0 = time.perf_counter()
    ttft = None
    usage = None
    stream = client.chat.completions.create(
        model=body["model"], messages=body["messages"], tools=body["tools"],
        tool_choice=body["tool_choice"], parallel_tool_calls=False, temperature=0,
        max_tokens=max_tokens, stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if ttft is None and chunk.choices and (chunk.choices[0].delta.content
                                               or chunk.choices[0].delta.tool_calls):
            ttft = time.perf_counter() - t0
    assert usage is not None
    details = usage.prompt_tokens_details
    return {"ttft": ttft if ttft is not None else time.perf_counter() - t0,
            "prompt": usage.prompt_tokens, "cached": details.cached_tokens if details else 0}


def run_policy(policy: str, *, replicas: int, tenants: int, per_tenant: int, kv_tokens: int,
               concurrency: int, max_tokens: int) -> dict[str, Any]:
    """One run of the workload through ``replicas`` replicas routed by ``policy``."""
    import httpx
    import openai
    import ray
    from ray import serve

    from grammarserve.cluster.serve import APP_NAME, RayServeConfig, build_app
    from grammarserve.config import EngineConfig
    from grammarserve.server.config import ServerConfig

    ray.init(num_cpus=replicas, object_store_memory=200 * 2**20, include_dashboard=False,
             log_to_driver=False)
    try:
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        engine = EngineConfig(kv_cache_tokens=kv_tokens, num_threads=1)
        serve.run(build_app(RayServeConfig(ServerConfig(engine=engine), replicas=replicas,
                                           router=policy)), name=APP_NAME, route_prefix="/")
        base = f"http://127.0.0.1:{port}"
        while httpx.get(f"{base}/health", timeout=30).json().get("replicas_ready") != replicas:
            time.sleep(1)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=900,
                               max_retries=0)
        before = _counters(base)
        order = wl.interleaved(tenants, per_tenant)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            results = list(pool.map(lambda tj: _one(client, tj[0], tj[1], max_tokens), order))
        wall = time.perf_counter() - t0
        after = _counters(base)
    finally:
        serve.shutdown()
        ray.shutdown()
    hits, misses = (after.get(k, 0) - before.get(k, 0) for k in GRAMMAR_COUNTERS)
    ttfts = sorted(r["ttft"] for r in results)
    n = len(results)
    return {"replicas": replicas, "policy": policy, "tenants": tenants, "requests": n,
            "prefix_cache_hit_rate": round(sum(r["cached"] for r in results)
                                           / sum(r["prompt"] for r in results), 4),
            "grammar_cache_hit_rate": round(hits / (hits + misses), 4) if hits + misses else None,
            "throughput_req_s": round(n / wall, 3),
            "ttft_p50_s": round(statistics.median(ttfts), 3),
            "ttft_p95_s": round(ttfts[min(n - 1, int(0.95 * n))], 3), "wall_s": round(wall, 1)}
