"""A ``nn.Linear`` that computes skinny CPU batches as ``W @ x.T``.

Decode batches have few rows (one per request, plus jump-forward tokens). For those, fp32 CPU
BLAS computes ``x @ W.T`` by packing the weight on every call; ``W @ x.T`` streams the weight
once instead, and it is fastest when the row count is a multiple of 8 (or 4 below that), so the
rows are zero-padded to one. Measured on the 2-core CPU VM (benchmarks/README.md, profiling log):
the 30 layers' matmuls of SmolLM2-135M at 8 rows 138 -> 68 ms, at 15 rows 134 -> 89 ms; the LM
head at 8 rows 47 -> 18 ms; equal at ~128 rows, so larger (prefill) batches keep ``F.linear``.
CUDA always uses ``F.linear``.

A linear may also carry its GGUF weight blocks, set by
:func:`grammarserve.models.quant_weights.attach_gguf_blocks`: ``quant_rows``, row segments in row
order, each of one kind (a fused qkv may be Q4_1 q/k rows and Q6_K v rows), and ``quant``, the one
segment where there is one. Batches of at most :data:`QUANT_ROWS` rows then run the AVX2 kernel
on ``quant`` instead of the fp32 weight; with ``quant_x16`` (the segments packed for int8
activations, the default) batches of at most :data:`Q8_ROWS` rows run the integer kernel
instead, each segment writing its columns of one output. Kinds the fp32-activation kernel lacks
(Q6_K: see :data:`~grammarserve_kernels.quant.FP32_KERNEL_KINDS`) never take that path: without
``quant_x16`` they use the fp32 weight.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from grammarserve_kernels.quant import FP32_KERNEL_KINDS, QuantWeight, quant_matmul
from grammarserve_kernels.quant_q8 import PackedWeight, quant_matmul_q8_rows
from torch import nn

SKINNY_ROWS = 96  # at most this many rows take the W @ x.T path on CPU
QUANT_ROWS = 24  # at most this many rows use the GGUF blocks (the crossover with BLAS is ~28)
Q8_ROWS = 1 << 20  # ... with int8 activations: every batch (faster than BLAS at any size, and
# a row's result does not depend on the batch it is in)


def _padded_rows(m: int) -> int:
    return 4 if m <= 4 else -(-m // 8) * 8


class Linear(nn.Linear):
    """Drop-in ``nn.Linear`` (same parameters and state dict) with the skinny CPU path.

    NOTE: on that path the output is a transposed view (column-major); callers that need
    contiguous rows (``view``, per-row kernels) must call ``.contiguous()`` or ``reshape``.
    """

    quant_rows: tuple[QuantWeight, ...] = ()  # the blocks as row segments, in row order
    quant: QuantWeight | None = None  # the blocks where they are one segment
    quant_x16: tuple[PackedWeight, ...] | None = None  # quant_rows for the int8-activation kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = x.shape[0]
        if self.quant_x16 is not None and x.dim() == 2 and m <= Q8_ROWS and x.device.type == "cpu":
            y = quant_matmul_q8_rows(x, self.quant_x16)
            return y if self.bias is None else y + self.bias
        if (self.quant is not None and self.quant.kind in FP32_KERNEL_KINDS and x.dim() == 2
                and m <= QUANT_ROWS and x.device.type == "cpu"):
            y = quant_matmul(x, self.quant)
            return y if self.bias is None else y + self.bias
        if x.dim() == 2 and m <= SKINNY_ROWS and x.device.type == "cpu":
            rows = _padded_rows(m)
            if rows != m:
                x = torch.cat([x, x.new_zeros(rows - m, x.shape[1])])
            y = torch.mm(self.weight, x.t())[:, :m].t()
            return y if self.bias is None else y + self.bias
        return F.linear(x, self.weight, self.bias)
