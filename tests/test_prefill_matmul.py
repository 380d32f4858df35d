"""Prefill-sized batches (``linear.PREFILL_ROWS`` rows and more) and ``prefill_matmul``: the
two-level int8 kernel by default, one int8 level, or bf16 GEMM on panels dequantized from the
blocks (``kernels/quant_panel.py``); smaller batches never change path; the loader sets the mode
and the kernel report times it."""

from __future__ import annotations

import shutil

import pytest
import torch
from grammarserve_kernels.quant import dequantize, pack_gguf_blocks
from grammarserve_kernels.quant_panel import amx_granted, panel_available
from grammarserve_kernels.quant_q8 import pack_x16, quant_matmul_q8_rows
from quant_helpers import random_blocks

from grammarserve.config import EngineConfig
from grammarserve.errors import InvalidRequestError
from grammarserve.models.kernel_report import measure_kernels
from grammarserve.models.linear import PREFILL_AUTO_FALLBACK, PREFILL_ROWS, Linear
from grammarserve.models.quant_weights import set_prefill_matmul

needs_kernel = pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512") or not shutil.which("c++"),
    reason="needs an AVX2 CPU and a C++ compiler")
#: bf16 inputs and weights, a bf16 product: ~3e-3 relative (bench_prefill_gemm.py), bounded here.
BF16_RTOL = 1e-2


def _linear() -> tuple[Linear, torch.Tensor]:
    """A fused linear of a Q4_1 segment and a Q6_K segment (as in Q4_K_M files), and its dense
    weight."""
    segs = [pack_gguf_blocks(kind, random_blocks(kind, n, 256, seed=n))
            for kind, n in (("Q4_1", 48), ("Q6_K", 37))]
    lin = Linear(256, 85, bias=True)
    lin.quant_x16 = tuple(pack_x16(w, levels=2) for w in segs)
    return lin, torch.cat([dequantize(w) for w in segs])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm())


@needs_kernel
@pytest.mark.parametrize("mode", ["int8x2", "int8", "bf16"])
def test_each_mode_multiplies_prefill_batches(mode: str) -> None:
    if mode == "bf16" and not panel_available():
        pytest.skip("no panel kernel here")
    lin, dense = _linear()
    lin.prefill_matmul = mode
    x = torch.randn(PREFILL_ROWS + 7, 256, generator=torch.Generator().manual_seed(1))
    y = lin(x)
    parts = lin.quant_x16
    assert parts is not None
    if mode == "bf16":
        assert _rel(y - lin.bias, x @ dense.t()) < BF16_RTOL
    else:  # the int8 kernels, bit for bit
        levels = 2 if mode == "int8x2" else 1
        assert torch.equal(y, quant_matmul_q8_rows(x, parts, levels=levels) + lin.bias)
    small = x[:PREFILL_ROWS - 1]  # below the threshold: the two-level kernel whatever the mode
    assert torch.equal(lin(small), quant_matmul_q8_rows(small, parts) + lin.bias)


@needs_kernel
def test_the_mode_is_set_on_every_linear_and_checked() -> None:
    model = torch.nn.Sequential(_linear()[0], _linear()[0])
    used = set_prefill_matmul(model, "bf16")  # type: ignore[arg-type]
    assert used == ("bf16" if panel_available() else "int8")
    assert all(m.prefill_matmul == used for m in model)
    with pytest.raises(ValueError, match="prefill_matmul must be one of"):
        set_prefill_matmul(model, "fp8")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError,
                       match="prefill_matmul must be auto, int8x2, int8 or bf16"):
        EngineConfig(prefill_matmul="fp8")  # type: ignore[arg-type]


@needs_kernel
def test_auto_takes_bf16_panels_exactly_where_amx_tiles_are_granted() -> None:
    model = torch.nn.Sequential(_linear()[0])
    used = set_prefill_matmul(model, "auto")  # type: ignore[arg-type]
    want = "bf16" if amx_granted() and panel_available() else PREFILL_AUTO_FALLBACK
    assert used == want and model[0].prefill_matmul == want
    assert EngineConfig().prefill_matmul == "int8x2"  # batch-independent rows by default


@pytest.mark.model
@needs_kernel
def test_the_kernel_report_times_the_prefill_matmul(smollm) -> None:  # type: ignore[no-untyped-def]
    assert smollm.kernels.prefill == "int8x2" and smollm.kernels.prefill_gops == 0.0
    set_prefill_matmul(smollm.model, "int8")
    try:
        report = measure_kernels(smollm.model, "int8")
    finally:
        set_prefill_matmul(smollm.model, "int8x2")
    assert report.prefill == "int8" and report.prefill_gops > 0
    assert "prefill matmul int8" in report.describe()
