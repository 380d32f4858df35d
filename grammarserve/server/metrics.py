"""Prometheus metrics: request counts and latencies measured by the server, plus the engine's
counters and gauges (:class:`EngineStats`) and the server-side grammar cache, read at scrape time.

Every app gets its own :class:`CollectorRegistry` (no process-global state).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from grammarserve.engine.stats import EngineStats
from grammarserve.fsm.cache import CacheStats

PREFIX = "grammarserve"
#: EngineStats fields that are levels, not running totals.
_GAUGES = {"running_requests", "waiting_requests", "kv_capacity", "kv_free", "kv_cached",
           "running_cap", "grammar_disk_bytes", "kv_host_tier_bytes", "kv_disk_tier_bytes",
           "memory_weights_bytes", "memory_available_bytes", "memory_activation_bytes",
           "kv_pool_bytes", "kv_mirror_tokens", "kv_host_tier_limit_bytes",
           "grammar_cache_bytes", "heap_in_use_bytes", "heap_free_held_bytes",
           "prefill_cap_tokens", "cpu_kernel_isa_level", "cpu_gemm_gops",
           "cpu_prefill_gemm_gops"}
_HELP = {
    "prompt_tokens": "Prompt tokens of finished requests",
    "cached_prompt_tokens": "Prompt tokens served from the radix prefix cache",
    "generated_tokens": "Generated tokens",
    "running_requests": "Requests holding KV (running)",
    "waiting_requests": "Requests waiting to be scheduled",
    "running_cap": ("Requests that may run at once: the decode batch size measured to give "
                    "the most tokens/s (--adaptive-batch), else --max-num-reqs"),
    "prefill_cap_tokens": ("Prefill tokens a step may take now while requests decode "
                           "(--step-time-target-s, by measured step cost; 0: no cap)"),
    "cpu_kernel_isa_level": ("Build of the int8 CPU matmul kernels the linears run on: 1 avx2, "
                             "2 avx512, 3 avx512vnni; 0 none"),
    "cpu_gemm_gops": ("Rate of those kernels measured at load on the largest linear at 64 rows "
                      "(10^9 operations/s)"),
    "cpu_prefill_gemm_gops": ("Rate of the prefill matmul (--prefill-matmul int8 or bf16) "
                              "measured at load at 512 rows (10^9 operations/s; 0: int8x2)"),
    "kv_capacity": "KV pool capacity in tokens",
    "memory_weights_bytes": "Bytes of the model's weights (the start-up memory plan)",
    "memory_available_bytes": ("Bytes free on the KV pool's device after the weights loaded, "
                               "which the memory plan shared out"),
    "memory_activation_bytes": "Bytes the memory plan keeps for one forward's activations",
    "kv_pool_bytes": "Bytes of the KV pool",
    "kv_mirror_tokens": "Decode mirror budget in tokens (filled as decodes need; 0: off)",
    "kv_host_tier_limit_bytes": "Bound of the host-memory KV tier (the memory plan's share)",
    "kv_free": "Free KV slots",
    "grammar_cache_bytes": "Bytes of compiled grammars the engine holds in memory (LRU-bounded)",
    "heap_in_use_bytes": "Bytes of the engine process's C heap in use (glibc mallinfo2)",
    "heap_free_held_bytes": ("Bytes freed in the engine process's C heap that the allocator "
                             "keeps (fragmentation; returned by the periodic trim)"),
    "kv_cached": "KV slots owned by the radix cache",
    "jump_forward_tokens": "Output tokens fed by jump-forward (no decode step of their own)",
    "check_retries": ("Value checks (keywords no grammar holds, checked when the value closes) "
                      "that failed and were rolled back and retried"),
    "check_failures": "Requests ended because their value checks kept failing",
    "loop_guard_cuts": ("Array items the loop guard took back (exact copies of an earlier "
                        "item, --loop-guard), closing the array there"),
    "grammar_compile_s": "Engine time spent compiling grammars",
    "spec_drafted_tokens": ("Speculative draft tokens fed to the model (n-gram drafts from the "
                            "prompt, the reply and earlier replies, checked by the matcher)"),
    "spec_accepted_tokens": "Speculative draft tokens the model chose (kept in the output)",
    "forward_passes": "Model forwards (steps)",
    "grammar_cache_hits": "Engine grammar cache hits",
    "grammar_cache_misses": "Engine grammar cache misses",
    "grammar_disk_hits": "Compiled grammars the engine served from the grammar disk cache",
    "grammar_disk_spec_hits": "Validated constraints the engine read from the grammar disk cache",
    "grammar_disk_misses": "Grammar disk cache lookups that found no (valid) entry",
    "grammar_disk_writes": "Entries the engine wrote to the grammar disk cache",
    "grammar_disk_corrupt": "Grammar disk cache entries found bad (removed, read as misses)",
    "grammar_disk_evictions": "Grammar disk cache entries removed to keep it within its bound",
    "grammar_disk_bytes": "Size of the grammar disk cache's folder (last measured)",
    "kv_host_hit_tokens": "Prompt tokens whose KV came back from the host-memory KV tier",
    "kv_disk_hit_tokens": "Prompt tokens whose KV came back from the disk KV tier",
    "kv_prefetched_tokens": ("Prompt tokens whose KV was read from the disk tier into host "
                             "memory while their request waited for admission"),
    "kv_demoted_tokens": "Evicted prefix tokens whose KV the host-memory tier kept",
    "kv_promote_s": "Engine time spent bringing KV back from the tiers into the pool",
    "kv_host_tier_bytes": "Bytes of KV blocks held by the host-memory tier",
    "kv_host_tier_evictions": "KV blocks the host-memory tier dropped to stay within its bound",
    "kv_disk_tier_bytes": "Size of the disk KV tier's folder (last measured)",
    "kv_disk_tier_writes": "KV blocks written to the disk tier",
    "kv_disk_tier_dropped": "KV blocks not written to the disk tier (its writer queue was full)",
    "kv_disk_tier_corrupt": "Disk KV tier entries found bad (removed, read as misses)",
    "grammar_upgrade_failures": "Background grammar upgrades that failed (logged; the request "
                                "keeps its first grammar)",
    "grammar_disk_write_failures": "Compiled grammars that could not be written to the disk cache",
    "grammar_forced_token_failures": "Jump-forward spans the grammar layer could not compute "
                                     "(the tokens are sampled instead)",
    "grammar_schema_id_failures": "Schemas whose $id/$anchor table could not be read",
    "grammar_journal_failures": "Crash-journal operations that failed (logged; never blocking)",
}
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)


def _metric_name(field: str) -> str:
    return f"{PREFIX}_{field[:-2]}_seconds" if field.endswith("_s") else f"{PREFIX}_{field}"


class _Snapshot(Collector):
    """Exports the last engine / grammar-cache snapshot given to :meth:`update`."""

    def __init__(self) -> None:
        self.engine: EngineStats | None = None
        self.grammar: CacheStats | None = None

    def collect(self) -> Iterator[Metric]:
        s = self.engine
        if s is not None:
            for f in dataclasses.fields(s):
                value = getattr(s, f.name)
                if not isinstance(value, (int, float)):
                    continue
                help_ = _HELP.get(f.name, f"engine statistic {f.name}")
                if f.name in _GAUGES:
                    yield GaugeMetricFamily(_metric_name(f.name), help_, value=value)
                else:
                    yield CounterMetricFamily(_metric_name(f.name), help_, value=value)
            used = s.kv_capacity - s.kv_free
            yield GaugeMetricFamily(f"{PREFIX}_kv_used", "Used KV slots", value=used)
            yield GaugeMetricFamily(
                f"{PREFIX}_tokens_per_forward", "Generated tokens per model forward since start "
                "(jump-forward and accepted drafts raise it above 1 per running request)",
                value=s.generated_tokens / max(s.forward_passes, 1))
            yield GaugeMetricFamily(f"{PREFIX}_kv_usage_ratio", "Used share of the KV pool",
                                    value=used / s.kv_capacity if s.kv_capacity else 0.0)
        g = self.grammar
        if g is not None:
            p = f"{PREFIX}_server_grammar"
            yield CounterMetricFamily(f"{p}_refused", "Constraints refused from memory (refused "
                                      "before), without validating or compiling them again",
                                      value=g.refused)
            if g.disk is not None:
                yield CounterMetricFamily(f"{p}_disk_spec_hits", "Validated constraints the "
                                          "server read from the grammar disk cache",
                                          value=g.disk.spec_hits)
                yield CounterMetricFamily(f"{p}_disk_writes", "Entries the server wrote to the "
                                          "grammar disk cache", value=g.disk.writes)


class ServerMetrics:
    """The server's Prometheus registry and the instruments the routes update."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(f"{PREFIX}_http_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=r)
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds", "Time to first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(f"{PREFIX}_inter_token_latency_seconds",
                             "Time between streamed outputs of one request",
                             buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram(f"{PREFIX}_request_latency_seconds", "Generation request latency",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}_request_prompt_tokens",
                                     "Prompt tokens of completed API requests", registry=r)
        self.cached_tokens = Counter(f"{PREFIX}_request_cached_tokens",
                                     "Cached prompt tokens of completed API requests", registry=r)
        self.completion_tokens = Counter(f"{PREFIX}_request_completion_tokens",
                                         "Completion tokens of completed API requests", registry=r)
        self.in_flight = Gauge(f"{PREFIX}_requests_in_flight",
                               "Engine requests submitted by the server and not finished",
                               registry=r)
        self.engine_restarts = Counter(f"{PREFIX}_engine_restarts",
                                       "Times the engine process died and was started again",
                                       registry=r)
        self.engine_request_crashes = Counter(
            f"{PREFIX}_engine_request_crashes", "Engine deaths blamed on a request (a native crash "
            "while its constraint compiled; the constraint is refused from then on)", registry=r)
        self.engine_stalls = Counter(
            f"{PREFIX}_engine_stalls", "Times the engine stopped making progress (no heartbeat, "
            "or one step past its limit) and was killed", registry=r)
        #: The engine process's id (its CPU and memory are exported as
        #: ``grammarserve_engine_process_*``; the server's own as ``process_*``).
        self.engine_pid: int | None = None
        Gauge(f"{PREFIX}_engine_pid", "The engine process's id (0: none running)",
              registry=r).set_function(lambda: self.engine_pid or 0)
        ProcessCollector(registry=r)
        ProcessCollector(namespace=f"{PREFIX}_engine", registry=r,
                         pid=lambda: self.engine_pid or "none")
        self._snapshot = _Snapshot()
        r.register(self._snapshot)

    def render(self, engine: EngineStats | None, grammar: CacheStats | None) -> bytes:
        self._snapshot.engine = engine
        self._snapshot.grammar = grammar
        return generate_latest(self.registry)

    def observe_usage(self, usage: dict[str, Any]) -> None:
        details = usage.get("prompt_tokens_details") or {}
        self.prompt_tokens.inc(usage["prompt_tokens"])
        self.completion_tokens.inc(usage["completion_tokens"])
        self.cached_tokens.inc(details.get("cached_tokens", 0))
