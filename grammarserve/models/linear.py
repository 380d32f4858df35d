"""A ``nn.Linear`` that computes skinny CPU batches as ``W @ x.T``.

Decode batches have few rows (one per request, plus jump-forward tokens). For those, fp32 CPU
BLAS computes ``x @ W.T`` by packing the weight on every call; ``W @ x.T`` streams the weight
once instead, and it is fastest when the row count is a multiple of 8 (or 4 below that), so the
rows are zero-padded to one. Measured on the 2-core CPU VM (benchmarks/README.md, profiling log):
the 30 layers' matmuls of SmolLM2-135M at 8 rows 138 -> 68 ms, at 15 rows 134 -> 89 ms; the LM
head at 8 rows 47 -> 18 ms; equal at ~128 rows, so larger (prefill) batches keep ``F.linear``.
CUDA always uses ``F.linear``.

A linear may also carry its GGUF weight blocks, set by
:func:`grammarserve.models.quant_weights.attach_gguf_blocks`, in one of two layouts (one copy):
``quant_x16``, the row segments packed for the int8-activation kernel (the default), or, with
fp32 activations, the segments in row order (``quant_rows``: each of one kind, e.g. a fused qkv of
Q4_1 q/k rows and Q6_K v rows; ``quant``, the one segment where there is one). With
``quant_x16`` batches of at most :data:`Q8_ROWS` rows run the integer kernel, each segment
writing its columns of one output; otherwise batches of at most :data:`QUANT_ROWS` rows run the
AVX2 kernel on ``quant`` (kinds it has: :data:`~grammarserve_kernels.quant.FP32_KERNEL_KINDS`).
Batches of at least :data:`PREFILL_ROWS` rows (prefill) take ``prefill_matmul`` instead of the
two-level kernel where it is set otherwise: ``"int8"``, one activation level (llama.cpp's Q8
numerics, ~5e-3 relative error, ~2x faster), or ``"bf16"``, torch's bf16 GEMM (oneDNN: AMX tiles
where the CPU has them) on panels dequantized from the blocks (``kernels/quant_panel.py``,
~3e-3). A row's result then depends on whether its batch reaches that size.
A linear with blocks may have no fp32 weight (``weight`` on the meta device, as the loader
leaves it): the paths that need one dequantize the blocks per call (:meth:`Linear.dense`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from grammarserve_kernels.quant import FP32_KERNEL_KINDS, QuantWeight, dequantize, quant_matmul
from grammarserve_kernels.quant_panel import PANEL_KINDS, PANEL_MIN_ROWS, panel_matmul
from grammarserve_kernels.quant_q8 import PackedWeight, quant_matmul_q8_rows, unpack_x16
from torch import nn

SKINNY_ROWS = 96  # at most this many rows take the W @ x.T path on CPU
QUANT_ROWS = 24  # at most this many rows use the GGUF blocks (the crossover with BLAS is ~28)
Q8_ROWS = 1 << 20  # ... with int8 activations: every batch (faster than BLAS at any size, and
# a row's result does not depend on the batch it is in)


#: Batches of at least this many rows take the linears' ``prefill_matmul`` (the rows from which
#: bf16 panels ran as fast as the two-level kernel, ``benchmarks/bench_prefill_gemm.py``).
PREFILL_ROWS = PANEL_MIN_ROWS
PREFILL_MATMULS = ("int8x2", "int8", "bf16")
#: ``prefill_matmul`` "auto": bf16 panels where AMX tiles are granted, else this.
PREFILL_AUTO_FALLBACK = "int8x2"


def _padded_rows(m: int) -> int:
    return 4 if m <= 4 else -(-m // 8) * 8


class Linear(nn.Linear):
    """Drop-in ``nn.Linear`` (same parameters and state dict) with the skinny CPU path.

    NOTE: on that path the output is a transposed view (column-major); callers that need
    contiguous rows (``view``, per-row kernels) must call ``.contiguous()`` or ``reshape``.
    """

    _rows: tuple[QuantWeight, ...] = ()  # the blocks in row layout (fp32 activations)
    quant_x16: tuple[PackedWeight, ...] | None = None  # the blocks for the int8-activation kernel
    prefill_matmul = "int8x2"  # batches of PREFILL_ROWS rows and more (one of PREFILL_MATMULS)

    @property
    def quant_rows(self) -> tuple[QuantWeight, ...]:
        """The blocks as row segments, in row order (rebuilt from ``quant_x16`` where only
        that layout is kept); ``()`` without blocks."""
        if self._rows or self.quant_x16 is None:
            return self._rows
        return tuple(unpack_x16(p) for p in self.quant_x16)

    @quant_rows.setter
    def quant_rows(self, rows: tuple[QuantWeight, ...]) -> None:
        self._rows = tuple(rows)

    @property
    def quant(self) -> QuantWeight | None:
        """The row-layout blocks where they are one segment (the fp32-activation kernel's)."""
        return self._rows[0] if len(self._rows) == 1 else None

    @quant.setter
    def quant(self, w: QuantWeight | None) -> None:
        self._rows = () if w is None else (w,)

    def dense(self) -> torch.Tensor:
        """The fp32 weight: ``weight``, or the blocks dequantized where it was not loaded."""
        if self.weight.device.type != "meta":
            return self.weight
        return torch.cat([dequantize(q) for q in self.quant_rows])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = x.shape[0]
        if self.quant_x16 is not None and x.dim() == 2 and m <= Q8_ROWS and x.device.type == "cpu":
            parts = self.quant_x16
            if m < PREFILL_ROWS or self.prefill_matmul == "int8x2":
                y = quant_matmul_q8_rows(x, parts)
            elif self.prefill_matmul == "bf16" and all(p.kind in PANEL_KINDS for p in parts):
                y = panel_matmul(x, parts)
            else:
                y = quant_matmul_q8_rows(x, parts, levels=1)
            return y if self.bias is None else y + self.bias
        quant = self.quant
        if (quant is not None and quant.kind in FP32_KERNEL_KINDS and x.dim() == 2
                and m <= QUANT_ROWS and x.device.type == "cpu"):
            y = quant_matmul(x, quant)
            return y if self.bias is None else y + self.bias
        weight = self.dense()
        if x.dim() == 2 and m <= SKINNY_ROWS and x.device.type == "cpu":
            rows = _padded_rows(m)
            if rows != m:
                x = torch.cat([x, x.new_zeros(rows - m, x.shape[1])])
            y = torch.mm(weight, x.t())[:, :m].t()
            return y if self.bias is None else y + self.bias
        return F.linear(x, weight, self.bias)
