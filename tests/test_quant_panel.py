"""Prefill panels over x16 weights (``quant_panel``): the dense rows ``dequantize_x16`` writes
equal ``quant.dequantize`` bit for bit (fp32) and its round-to-nearest-even (bf16) for every kind,
any row range; ``panel_matmul`` equals the float64 product within bf16's rounding (or fp32's,
with ``dtype=torch.float32``), also over row segments of mixed kinds."""

from __future__ import annotations

import shutil

import pytest
import torch
from grammarserve_kernels.quant import QuantWeight, dequantize, pack_gguf_blocks
from grammarserve_kernels.quant_panel import (
    dequantize_x16,
    measure_panel_gops,
    panel_available,
    panel_matmul,
    random_quant_weight,
)
from grammarserve_kernels.quant_q8 import pack_x16, supported_isas
from quant_helpers import random_blocks

pytestmark = pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512") or not shutil.which("c++"),
    reason="needs an AVX2 CPU and a C++ compiler")

#: bf16 panel vs float64, relative Frobenius error: x, W and the output each rounded to 8-bit
#: mantissas (2^-9 relative each, ~0.3% together in the worst case; ~0.15-0.25% measured).
BF16_TOLERANCE = 6e-3
#: fp32 panel vs float64: the exact weights, fp32 accumulation over K <= 512.
FP32_TOLERANCE = 1e-5


def _weight(kind: str, n: int, k: int, seed: int = 0) -> QuantWeight:
    """GGUF blocks of ``kind`` (edge values included: d = 0, extreme scales) as a QuantWeight."""
    return pack_gguf_blocks(kind, random_blocks(kind, n, k, seed))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("kind,k", [("Q8_0", 96), ("Q4_1", 96), ("Q4_K", 512), ("Q6_K", 256),
                                    ("Q6_K", 512)])
def test_dense_rows_equal_dequantize_bit_for_bit(kind: str, k: int) -> None:
    q = _weight(kind, 37, k)  # 37: two whole tiles and a partial third
    ref = dequantize(q)
    for isa in supported_isas():
        w = pack_x16(q, isa)
        assert torch.equal(_bits(dequantize_x16(w)), _bits(ref))
        assert torch.equal(_bits(dequantize_x16(w, torch.bfloat16)), _bits(ref.bfloat16()))
        for rows in (slice(5, 30), slice(16, 32), slice(33, None), slice(0, 1), slice(-3, None)):
            got = dequantize_x16(w, torch.float32, rows)
            assert got.is_contiguous() and torch.equal(_bits(got), _bits(ref[rows]))
            assert torch.equal(_bits(dequantize_x16(w, torch.bfloat16, rows)),
                               _bits(ref[rows].bfloat16()))
    assert dequantize_x16(pack_x16(q), rows=slice(20, 20)).shape == (0, k)
    buf = torch.full((25, k), float("nan"), dtype=torch.bfloat16)
    assert dequantize_x16(pack_x16(q), torch.bfloat16, slice(5, 30), out=buf) is buf
    assert torch.equal(_bits(buf), _bits(ref[5:30].bfloat16()))


def test_bf16_rounds_to_nearest_even() -> None:
    """Q8_0 values d * q straddling bf16 ties: the products that end exactly on a half-step go
    to the even neighbour, as torch's .bfloat16() does."""
    q = random_quant_weight("Q8_0", 16, 64)
    d = torch.full_like(q.d, 1.0 + 2.0 ** -8)  # d * q sits on bf16 ties for many q
    tie = QuantWeight("Q8_0", q.qs, d, q.m)
    ref = dequantize(tie)
    assert torch.equal(_bits(dequantize_x16(pack_x16(tie), torch.bfloat16)), _bits(ref.bfloat16()))


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_1", "Q6_K"])
@pytest.mark.parametrize("m", [1, 7, 64])
def test_panel_matmul_matches_float64(kind: str, m: int) -> None:
    q = _weight("Q4_K" if kind == "Q4_1" else kind, 70, 512, seed=m)
    x = torch.randn(m, 512, generator=torch.Generator().manual_seed(m))
    ref = x.double() @ dequantize(q).double().t()
    w = pack_x16(q)
    for panel_rows in (16, 48, 512):  # several panels, a partial last one, and one panel
        bf16 = panel_matmul(x, (w,), panel_rows=panel_rows)
        assert bf16.dtype == torch.float32 and bf16.shape == (m, 70)
        assert _rel(bf16, ref) < BF16_TOLERANCE
        assert _rel(panel_matmul(x, (w,), torch.float32, panel_rows), ref) < FP32_TOLERANCE


def test_mixed_kind_segments_fill_their_columns() -> None:
    """A fused qkv of Q4_1 q/k and a Q6_K v: each segment's columns equal that segment alone."""
    qk, v = _weight("Q4_K", 48, 512, seed=1), _weight("Q6_K", 20, 512, seed=2)
    x = torch.randn(9, 512)
    parts = (pack_x16(qk), pack_x16(v))
    ref = x.double() @ torch.cat([dequantize(qk), dequantize(v)]).double().t()
    for dtype, tol in ((torch.bfloat16, BF16_TOLERANCE), (torch.float32, FP32_TOLERANCE)):
        y = panel_matmul(x, parts, dtype, panel_rows=32)
        assert y.shape == (9, 68) and _rel(y, ref) < tol
        assert torch.equal(y[:, 48:], panel_matmul(x, parts[1:], dtype, panel_rows=32))
        assert torch.equal(y[:, :48], panel_matmul(x, parts[:1], dtype, panel_rows=32))


def test_bad_inputs_are_refused() -> None:
    w = pack_x16(random_quant_weight("Q4_1", 16, 64))
    other = pack_x16(random_quant_weight("Q6_K", 16, 256))
    with pytest.raises(ValueError, match="at least one"):
        panel_matmul(torch.randn(2, 64), ())
    with pytest.raises(ValueError, match="share K"):
        panel_matmul(torch.randn(2, 64), (w, other))
    with pytest.raises(ValueError, match="fp32"):
        panel_matmul(torch.randn(2, 64, dtype=torch.float64), (w,))
    with pytest.raises(ValueError, match="dtype"):
        panel_matmul(torch.randn(2, 64), (w,), torch.float16)
    with pytest.raises(ValueError, match="contiguous slice"):
        dequantize_x16(w, rows=slice(0, 8, 2))
    with pytest.raises(ValueError, match="out must be"):
        dequantize_x16(w, torch.bfloat16, out=torch.empty(16, 64))
    with pytest.raises(ValueError, match="out must be contiguous"):
        dequantize_x16(w, rows=slice(0, 8), out=torch.empty(8, 128)[:, :64])


def test_panel_kernel_is_available_and_measures_a_rate() -> None:
    assert panel_available()
    assert measure_panel_gops(64, 32, 8, repeat=1) > 0.0
