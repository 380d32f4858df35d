"""Per-process device setup for an engine on CUDA."""

from __future__ import annotations

import torch


def setup_cuda(device: torch.device, *, tf32: bool) -> None:
    """Make ``device`` current (so Triton launches and the caching allocator use ``cuda:N``, not
    ``cuda:0``) and set the fp32 matmul precision (TF32 or full fp32: a process-wide torch
    setting, which the engine owns in its process)."""
    if device.index is not None:  # "cuda" alone means the current device already
        torch.cuda.set_device(device)
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
