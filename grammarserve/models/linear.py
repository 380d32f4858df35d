"""A ``nn.Linear`` that computes skinny CPU batches as ``W @ x.T``.

Decode batches have few rows (one per request). For those, fp32 CPU BLAS computes
``x @ W.T`` by packing the weight on every call; ``W @ x.T`` streams the weight once instead.
Measured on the 2-core CPU VM (benchmarks/README.md, profiling log): the whole SmolLM2-135M
matmul work at 8 rows 134 -> 86 ms, the LM head alone at 8 rows 47 -> 18 ms; equal at ~128 rows,
slower above, so larger (prefill) batches keep ``F.linear``. CUDA always uses ``F.linear``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SKINNY_ROWS = 96  # at most this many rows take the W @ x.T path on CPU


class Linear(nn.Linear):
    """Drop-in ``nn.Linear`` (same parameters and state dict) with the skinny CPU path."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.shape[0] <= SKINNY_ROWS and x.device.type == "cpu":
            y = torch.mm(self.weight, x.t()).t().contiguous()
            return y if self.bias is None else y + self.bias
        return F.linear(x, self.weight, self.bias)
