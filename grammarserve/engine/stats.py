"""Engine counters (exported later by the server as Prometheus metrics)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grammarserve.engine.heap import HeapUsage
from grammarserve.engine.kv_tiers.tiers import TierStats
from grammarserve.engine.memory_plan import MemoryPlan
from grammarserve.fsm.disk_cache import DiskCacheStats
from grammarserve.fsm.failures import FailureCounts


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's counters and gauges."""

    prompt_tokens: int
    cached_prompt_tokens: int
    generated_tokens: int
    finished_requests: int
    running_requests: int
    waiting_requests: int
    kv_capacity: int
    kv_free: int
    kv_cached: int  # slots owned by the radix cache
    evicted_tokens: int
    preemptions: int
    forward_passes: int
    running_cap: int = 0  # the requests that may run at once now (BatchSizer)
    prefill_cap_tokens: int = 0  # the prefill tokens a step may take now (StepPacer; 0: none)
    cpu_kernel_isa_level: int = 0  # the int8 CPU kernels' build (1 avx2 .. 3 avx512vnni; 0)
    cpu_gemm_gops: float = 0.0  # their rate measured at load (kernel_report.py)
    cpu_prefill_gemm_gops: float = 0.0  # the prefill matmul's rate, where not the kernels'
    constrained_requests: int = 0
    aborted_requests: int = 0  # stopped by Engine.abort (a client disconnect, a cancel)
    grammar_errors: int = 0  # constraints that failed to compile or reached a dead end
    jump_forward_tokens: int = 0  # output tokens fed without their own decode step
    check_retries: int = 0  # value checks that failed and were rolled back and retried
    check_failures: int = 0  # requests ended because their value checks kept failing
    loop_guard_cuts: int = 0  # array items the loop guard took back (copies of earlier ones)
    mask_fill_s: float = 0.0  # time spent filling bitmasks (overlapped with the forward)
    mask_wait_s: float = 0.0  # time the step waited for bitmasks after the forward
    grammar_cache_hits: int = 0
    grammar_cache_misses: int = 0
    grammar_compile_s: float = 0.0
    grammar_disk_hits: int = 0  # compiled grammars served from the disk cache
    grammar_disk_spec_hits: int = 0  # front-end results served from it
    grammar_disk_misses: int = 0
    grammar_disk_writes: int = 0
    grammar_disk_corrupt: int = 0  # entries found bad (removed; read as misses)
    grammar_disk_evictions: int = 0
    grammar_disk_bytes: int = 0  # size of the disk cache's folder (last measured)
    grammar_cache_bytes: int = 0  # compiled grammars held in memory (bounded by the LRU)
    # Failures the grammar layer survived (logged, rate-limited; fsm/failures.py):
    grammar_upgrade_failures: int = 0  # background upgrades / per-style compiles that failed
    grammar_disk_write_failures: int = 0  # grammars not written to the disk cache
    grammar_forced_token_failures: int = 0  # jump-forward spans that failed (none fed)
    grammar_schema_id_failures: int = 0  # schemas whose $ids could not be read
    grammar_journal_failures: int = 0  # crash journal entries not written, read or removed
    kv_host_hit_tokens: int = 0  # prompt tokens whose KV came back from the host tier
    kv_disk_hit_tokens: int = 0  # ... from the disk tier
    kv_prefetched_tokens: int = 0  # read from disk into the host tier while queued
    kv_demoted_tokens: int = 0  # evicted tokens whose KV the host tier took
    kv_promote_s: float = 0.0  # time spent bringing KV back from the tiers
    kv_host_tier_bytes: int = 0
    kv_host_tier_evictions: int = 0
    kv_disk_tier_bytes: int = 0  # size of the disk tier's folder (last measured)
    kv_disk_tier_writes: int = 0
    kv_disk_tier_dropped: int = 0  # blocks not written (the writer's queue was full)
    kv_disk_tier_corrupt: int = 0  # entries found bad (removed; read as misses)
    spec_drafted_tokens: int = 0  # speculative draft tokens fed (checked by the matcher)
    spec_accepted_tokens: int = 0  # of them, the ones the model chose (kept in the output)
    # The start-up memory plan (engine/memory_plan.py), in numbers a sum over replicas keeps:
    memory_weights_bytes: int = 0
    memory_available_bytes: int = 0  # on the pool's device after the weights
    memory_activation_bytes: int = 0  # kept for one forward's transients
    kv_pool_bytes: int = 0
    kv_mirror_tokens: int = 0  # the decode mirror's budget (it fills as decodes need)
    kv_host_tier_limit_bytes: int = 0  # the host tier's bound (kv_host_tier_bytes: held now)
    # The engine process's C heap (glibc mallinfo2; 0 where unknown):
    heap_in_use_bytes: int = 0
    heap_free_held_bytes: int = 0  # freed but kept by the allocator (fragmentation)


def disk_fields(disk: DiskCacheStats | None) -> dict[str, Any]:
    """The ``grammar_disk_*`` fields of :class:`EngineStats` from the compiler's disk cache."""
    if disk is None:
        return {}
    return {"grammar_disk_hits": disk.grammar_hits, "grammar_disk_spec_hits": disk.spec_hits,
            "grammar_disk_misses": disk.misses, "grammar_disk_writes": disk.writes,
            "grammar_disk_corrupt": disk.corrupt, "grammar_disk_evictions": disk.evictions,
            "grammar_disk_bytes": disk.bytes}


def failure_fields(counts: FailureCounts) -> dict[str, Any]:
    """The ``grammar_*_failures`` fields of :class:`EngineStats` from the grammar layer's
    failure counts (``fsm/failures.py``: ``FAILURES.counts()``)."""
    return {"grammar_upgrade_failures": counts.upgrade,
            "grammar_disk_write_failures": counts.disk_write,
            "grammar_forced_token_failures": counts.forced_tokens,
            "grammar_schema_id_failures": counts.local_refs,
            "grammar_journal_failures": counts.journal}


def tier_fields(tiers: TierStats | None) -> dict[str, Any]:
    """The ``kv_*`` tier fields of :class:`EngineStats` from the engine's KV tiers."""
    if tiers is None:
        return {}
    return {"kv_host_hit_tokens": tiers.host_hit_tokens,
            "kv_disk_hit_tokens": tiers.disk_hit_tokens,
            "kv_prefetched_tokens": tiers.prefetched_tokens,
            "kv_demoted_tokens": tiers.demoted_tokens, "kv_promote_s": tiers.promote_s,
            "kv_host_tier_bytes": tiers.host_bytes,
            "kv_host_tier_evictions": tiers.host_evictions,
            "kv_disk_tier_bytes": tiers.disk_bytes, "kv_disk_tier_writes": tiers.disk_writes,
            "kv_disk_tier_dropped": tiers.disk_dropped,
            "kv_disk_tier_corrupt": tiers.disk_corrupt}


def plan_fields(plan: MemoryPlan) -> dict[str, Any]:
    """The memory-plan fields of :class:`EngineStats`."""
    return {"memory_weights_bytes": plan.weights_bytes,
            "memory_available_bytes": plan.available_bytes,
            "memory_activation_bytes": plan.activation_bytes, "kv_pool_bytes": plan.kv_bytes,
            "kv_mirror_tokens": plan.mirror_tokens,
            "kv_host_tier_limit_bytes": plan.host_tier_bytes}


def heap_fields(heap: HeapUsage | None) -> dict[str, Any]:
    """The ``heap_*`` fields of :class:`EngineStats` (none where the C library has no
    ``mallinfo2``)."""
    if heap is None:
        return {}
    return {"heap_in_use_bytes": heap.in_use, "heap_free_held_bytes": heap.free_held}
