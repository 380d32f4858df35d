"""Memory facts for sizing the KV pool and reporting at start-up."""

from __future__ import annotations

import os
import resource

import torch


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
