"""Which CPU matmul kernels a loaded model runs on, and how fast they measured at start-up.

The int8-activation kernels are built per instruction set and chosen at run time
(``kernels/quant_q8.py``: ``cpu_isa``). :func:`measure_kernels` names the build the model's
linears use and times it once on the model's largest linear at 64 rows (about 0.1 s at a 1.7B
shape); where prefill-sized batches take another path (``Linear.prefill_matmul``) it also times
that on the largest decoder linear at 512 rows, and it says whether the CPU has AMX tiles (which
oneDNN's bf16 GEMM uses; asking also requests the tile permission from Linux). The start-up log
and ``/metrics`` say what the machine gives (``grammarserve_cpu_kernel_isa_level``,
``grammarserve_cpu_gemm_gops``, ``grammarserve_cpu_prefill_gemm_gops``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from grammarserve_kernels.quant_panel import amx_granted
from grammarserve_kernels.quant_q8 import ISAS

from grammarserve.models.linear import Linear
from grammarserve.models.llama import LlamaModel

#: Rows of the timed products: decode-sized and prefill-sized.
ROWS = 64
PREFILL_ROWS_TIMED = 512


@dataclass(frozen=True)
class KernelReport:
    """``isa``: the int8 kernels' build (one of ``quant_q8.ISAS``), None where the linears have
    no int8 blocks; ``levels``: activation levels (2: int8x2); ``gemm_gops``: the measured rate
    in 10^9 multiply-adds x 2 per second (0.0 where not measured)."""

    isa: str | None
    levels: int
    gemm_gops: float
    prefill: str = "int8x2"  #: ``Linear.prefill_matmul`` of the linears
    prefill_gops: float = 0.0  #: its rate at PREFILL_ROWS_TIMED rows (0.0: int8x2, not timed)
    amx: bool = False  #: the CPU has AMX tiles and Linux granted them

    @property
    def isa_level(self) -> int:
        """1 + the build's index in ``ISAS`` (avx2 1, avx512 2, avx512vnni 3); 0: none."""
        return ISAS.index(self.isa) + 1 if self.isa is not None else 0

    def describe(self) -> str:
        if self.isa is None:
            return "no int8 CPU kernel (linears on fp32 weights)"
        text = (f"int8 CPU kernels: {self.isa} build, {self.levels} activation level(s), "
                f"{self.gemm_gops:.0f} GOP/s measured at {ROWS} rows; AMX tiles "
                f"{'granted' if self.amx else 'absent'}; prefill matmul {self.prefill}")
        if self.prefill_gops:
            text += f", {self.prefill_gops:.0f} GOP/s measured at {PREFILL_ROWS_TIMED} rows"
        return text


#: The report of a model whose linears have no int8 blocks.
NO_KERNELS = KernelReport(None, 0, 0.0)


def measure_kernels(model: LlamaModel, prefill: str = "int8x2") -> KernelReport:
    """The build ``model``'s linears use and its rate on the largest of them, and the rate of
    their ``prefill`` matmul where it is not the two-level kernel (see the module docstring)."""
    linears = [m for m in model.modules() if isinstance(m, Linear) and m.quant_x16]
    if not linears:
        return NO_KERNELS
    largest = max(linears, key=lambda m: m.weight.shape[0] * m.weight.shape[1])
    parts = largest.quant_x16
    assert parts is not None
    decode = _gops(largest, ROWS)
    prefill_gops = 0.0
    if prefill != "int8x2":
        layers = [m for m in linears if m is not model.lm_head] or linears
        prefill_gops = _gops(max(layers, key=lambda m: m.weight.shape[0] * m.weight.shape[1]),
                             PREFILL_ROWS_TIMED)
    return KernelReport(parts[0].isa, parts[0].levels, decode, prefill, prefill_gops,
                        amx_granted())


def _gops(linear: Linear, rows: int) -> float:
    """``linear``'s measured rate on ``rows`` random rows (the best of three after a warm-up)."""
    n, k = linear.weight.shape
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        linear(x)  # NOTE: the first call pays the per-thread warm-up
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            linear(x)
            best = min(best, time.perf_counter() - t0)
    return 2 * rows * n * k / best / 1e9
