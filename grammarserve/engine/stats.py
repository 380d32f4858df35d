"""Engine counters (exported later by the server as Prometheus metrics)."""

from __future__ import annotations

from dataclasses import dataclass


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

    @property
    def kv_used(self) -> int:
        return self.kv_capacity - self.kv_free
