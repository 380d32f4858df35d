"""Which CPU matmul kernel a loaded model runs on, and how fast it measured at start-up.

The int8-activation kernels are built per instruction set and chosen at run time
(``kernels/quant_q8.py``: ``cpu_isa``). :func:`measure_kernels` names the build the model's
linears use and times it once on the model's largest linear at 64 rows (a prefill-sized product,
about 0.1 s at a 1.7B shape), so that the start-up log and ``/metrics`` say what the machine
gives (``grammarserve_cpu_kernel_isa_level``, ``grammarserve_cpu_gemm_gops``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from grammarserve_kernels.quant_q8 import ISAS, quant_matmul_q8_rows

from grammarserve.models.linear import Linear
from grammarserve.models.llama import LlamaModel

#: Rows of the timed product.
ROWS = 64


@dataclass(frozen=True)
class KernelReport:
    """``isa``: the int8 kernels' build (one of ``quant_q8.ISAS``), None where the linears have
    no int8 blocks; ``levels``: activation levels (2: int8x2); ``gemm_gops``: the measured rate
    in 10^9 multiply-adds x 2 per second (0.0 where not measured)."""

    isa: str | None
    levels: int
    gemm_gops: float

    @property
    def isa_level(self) -> int:
        """1 + the build's index in ``ISAS`` (avx2 1, avx512 2, avx512vnni 3); 0: none."""
        return ISAS.index(self.isa) + 1 if self.isa is not None else 0

    def describe(self) -> str:
        if self.isa is None:
            return "no int8 CPU kernel (linears on fp32 weights)"
        return (f"int8 CPU kernels: {self.isa} build, {self.levels} activation level(s), "
                f"{self.gemm_gops:.0f} GOP/s measured at {ROWS} rows")


#: The report of a model whose linears have no int8 blocks.
NO_KERNELS = KernelReport(None, 0, 0.0)


def measure_kernels(model: LlamaModel) -> KernelReport:
    """The build ``model``'s linears use and its rate on the largest of them (see the module
    docstring)."""
    linears = [m for m in model.modules() if isinstance(m, Linear) and m.quant_x16]
    if not linears:
        return NO_KERNELS
    largest = max(linears, key=lambda m: m.weight.shape[0] * m.weight.shape[1])
    parts = largest.quant_x16
    assert parts is not None
    n, k = largest.weight.shape
    x = torch.randn(ROWS, k, generator=torch.Generator().manual_seed(0))
    quant_matmul_q8_rows(x, parts)  # NOTE: the first call pays the per-thread warm-up
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        quant_matmul_q8_rows(x, parts)
        best = min(best, time.perf_counter() - t0)
    return KernelReport(parts[0].isa, parts[0].levels, 2 * ROWS * n * k / best / 1e9)
