"""Host lists to device tensors without a blocking copy.

``torch.tensor(list, device="cuda")`` copies from pageable memory and synchronises the stream:
the host then waits for every kernel already queued. A step's small index lists are instead
packed into one pinned buffer and sent with one asynchronous copy (the caching host allocator
keeps the buffer alive until the copy has run).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch


def stage_int64(lists: Sequence[Sequence[int]], device: torch.device) -> list[torch.Tensor]:
    """One int64 tensor on ``device`` per list, sent with a single host->device copy."""
    flat = torch.tensor(list(itertools.chain.from_iterable(lists)), dtype=torch.int64)
    if device.type == "cuda":
        flat = flat.pin_memory().to(device, non_blocking=True)
    return list(flat.split([len(x) for x in lists]))


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``; through pinned memory and without a sync on CUDA."""
    if device.type != "cuda" or t.device.type == "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
