"""Memory facts for sizing the KV pool and reporting at start-up."""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

import torch

from grammarserve.config import EngineConfig
from grammarserve.errors import OutOfMemoryError
from grammarserve.models.config import ModelConfig


def available_memory_bytes(device: torch.device) -> int:
    """Free device memory (CUDA) or the host's MemAvailable (CPU)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    found = _proc_kib("/proc/meminfo", "MemAvailable:")
    if found is not None:
        return found
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def process_rss_bytes() -> int:
    """Resident set size of this process now (falls back to the peak)."""
    found = _proc_kib("/proc/self/status", "VmRSS:")
    if found is not None:
        return found
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def kv_tokens_for_budget(fraction: float, bytes_per_token: int, device: torch.device) -> int:
    """How many tokens of KV fit in ``fraction`` of the currently available memory."""
    return max(1, int(available_memory_bytes(device) * fraction) // bytes_per_token)


def mirror_tokens_for(capacity: int, setting: int | None) -> int:
    """The decode mirror's token budget: ``setting``, or max(capacity / 2, 32768) when None."""
    return max(capacity // 2, 32768) if setting is None else setting


@dataclass(frozen=True)
class ActivationShape:
    """What one forward's transient tensors scale with (see :func:`activation_reserve_bytes`)."""

    max_batch_tokens: int
    max_rows: int  # requests per forward: rows of logits
    hidden: int
    intermediate: int
    q_width: int  # heads * head_dim
    kv_width: int  # kv_heads * head_dim
    vocab: int
    elem: int  # bytes per activation element


def activation_reserve_bytes(a: ActivationShape) -> int:
    """Memory to keep free for one forward of ``max_batch_tokens`` tokens: the largest layer's
    transients (residual, norm, fused QKV and its rotated copy, attention output, gate/up and
    their product) and the fp32 logits with the sampler's working copies, times two for the
    allocator's rounding and fragmentation."""
    per_token = (3 * a.hidden + 2 * (a.q_width + 2 * a.kv_width) + a.q_width
                 + 3 * a.intermediate) * a.elem
    logits = a.max_rows * a.vocab * (a.elem + 3 * 4)
    return 2 * (a.max_batch_tokens * per_token + logits)


#: The smallest KV pool a planned (not explicitly sized) engine starts with: below it, the
#: machine has no room to serve, and starting would only fail every request later.
MIN_PLANNED_KV_TOKENS = 512


def plan_kv_tokens(available: int, fraction: float, bytes_per_token: int, *,
                   reserve: int = 0, mirror: int | None = 0, gather_layers: int = 0) -> int:
    """KV pool capacity (tokens) whose whole cost fits in ``fraction`` of what is left of
    ``available`` bytes (measured after the weights were loaded) once ``reserve`` is set aside.

    The cost counts the pool, the decode mirror (``mirror``: its token budget, 0 = none, None =
    :func:`mirror_tokens_for`'s default, which grows with the capacity) and, for backends that
    gather one layer's K/V of the batch per call (``gather_layers`` = the model's layer count),
    that gathered copy: up to 1 / layers of the pool.
    """
    budget = max(0, available - reserve) * fraction
    per_token = bytes_per_token * (1 + (1 / gather_layers if gather_layers else 0))
    if mirror is None:
        floor = mirror_tokens_for(0, None)
        big = int(budget / (per_token + bytes_per_token / 2))  # mirror = capacity / 2
        capacity = big if big // 2 >= floor else int((budget - floor * bytes_per_token)
                                                     / per_token)
    else:
        capacity = int((budget - mirror * bytes_per_token) / per_token)
    return max(0, capacity)


def plan_capacity(c: EngineConfig, mc: ModelConfig, bytes_per_token: int, *,
                  varlen: bool) -> int:
    """KV tokens for ``kv_memory_fraction`` of the memory left after the weights, less one
    forward's activations, counting the decode mirror or the varlen backend's gather; raises
    :class:`OutOfMemoryError` (naming the two settings) below ``MIN_PLANNED_KV_TOKENS``."""
    reserve = activation_reserve_bytes(ActivationShape(
        c.max_batch_tokens, c.max_num_reqs, mc.hidden_size, mc.intermediate_size,
        mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim, mc.vocab_size,
        c.torch_dtype.itemsize))
    assert c.kv_memory_fraction is not None  # resolved
    available = available_memory_bytes(c.torch_device)
    planned = plan_kv_tokens(
        available, c.kv_memory_fraction, bytes_per_token, reserve=reserve,
        mirror=0 if varlen else c.decode_mirror_tokens,
        gather_layers=mc.num_layers if varlen else 0)
    if planned < MIN_PLANNED_KV_TOKENS:
        raise OutOfMemoryError(
            f"only {planned} KV cache tokens fit in kv_memory_fraction="
            f"{c.kv_memory_fraction} of the {available / 2**20:.0f} MiB available after "
            f"the weights (less {reserve / 2**20:.0f} MiB for one forward's activations); "
            f"at least {MIN_PLANNED_KV_TOKENS} are needed: free memory, raise "
            "kv_memory_fraction, or set kv_cache_tokens")
    return planned


def _proc_kib(path: str, key: str) -> int | None:
    """Bytes of a ``key: N kB`` line of a /proc file, or None where there is none."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None

