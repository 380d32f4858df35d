"""The int8-activation kernel over GGUF Q4_1 / Q8_0 / Q6_K blocks (``kernels/quant_q8_cpu.cpp``):
every instruction-set build this CPU runs equals the float64 reference of the same quantized
product, row segments of mixed kinds write one output (each only its columns), the two-level
mode stays within 1e-4 of the exact product, dispatch can be capped, and
the model's linears use it for decode-sized batches only (Q6_K linears never use the fp32-activation
kernel, which has no Q6_K path)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from grammarserve_kernels import quant_q8
from grammarserve_kernels.quant import QuantWeight, dequantize, pack_gguf_blocks
from grammarserve_kernels.quant_q8 import (
    ISAS,
    PackedWeight,
    cpu_isa,
    pack_x16,
    quant_matmul_q8,
    quant_matmul_q8_ref,
    quant_matmul_q8_rows,
    quantize_activations_ref,
    quantize_residual_ref,
    supported_isas,
)
from isa_helpers import require_isa
from quant_helpers import random_blocks

from grammarserve.config import EngineConfig
from grammarserve.errors import InvalidRequestError
from grammarserve.models.linear import Q8_ROWS, Linear

can_build = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") and bool(
    shutil.which("c++"))
needs_kernel = pytest.mark.skipif(not can_build, reason="needs an AVX2 CPU and a C++ compiler")


def _check_against_reference(w: QuantWeight, packed: PackedWeight, row_counts: tuple[int, ...],
                             gen: torch.Generator) -> None:
    """The kernel on ``packed`` equals the float64 reference on ``w`` at each row count and
    both activation levels."""
    n, k = w.shape
    for rows in row_counts:
        x = torch.randn(rows, k, generator=gen)
        for levels in (1, 2):
            got = quant_matmul_q8(x, packed, levels=levels)
            assert got.shape == (rows, n) and got.is_contiguous()
            torch.testing.assert_close(got, quant_matmul_q8_ref(x, w, levels),
                                       rtol=1e-5, atol=1e-5 * k ** 0.5)


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("k", [32, 96, 576, 1536])  # 32, 96: an odd number of blocks
def test_kernel_matches_reference(isa: str, kind: str, k: int) -> None:
    require_isa(isa)  # skips an ISA this CPU lacks; fails where its build failed
    gen = torch.Generator().manual_seed(k)
    for n in (5, 16, 17, 72):  # partial, exact and multiple tiles of 16 rows
        w = pack_gguf_blocks(kind, random_blocks(kind, n, k, seed=k + n))
        _check_against_reference(w, pack_x16(w, isa), (1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 17), gen)


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("k", [256, 512, 4096])
def test_q6_k_kernel_matches_reference(isa: str, k: int) -> None:
    """Q6_K (a scale per 16 values, q - 32 as an offset term on the sums per 16), with the edge
    blocks of ``random_blocks`` (d = 0, scales -128 and 127, values 0 and 63)."""
    require_isa(isa)
    gen = torch.Generator().manual_seed(k)
    for n in (5, 37):  # a partial tile; two tiles and a partial one
        w = pack_gguf_blocks("Q6_K", random_blocks("Q6_K", n, k, seed=k + n))
        packed = pack_x16(w, isa)
        # 6.625 bits a weight: nibbles and high bit pairs, int8 scales per 16, fp32 d per 256
        assert packed.qs.shape == (-(-n // 16), k // 32, 6, 64)
        assert packed.d.shape == (-(-n // 16), k // 256, 16)
        assert packed.m.shape == (-(-n // 16), k // 32, 2, 16) and packed.m.dtype == torch.int8
        _check_against_reference(w, packed, (1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 64, 65), gen)


SEGMENTS = (("Q4_1", 37), ("Q6_K", 50), ("Q8_0", 21))  # no segment a whole number of tiles


def _segments(k: int) -> list[QuantWeight]:
    return [pack_gguf_blocks(kind, random_blocks(kind, n, k, seed=n)) for kind, n in SEGMENTS]


def _dense_ref(x: torch.Tensor, dense: torch.Tensor, levels: int) -> torch.Tensor:
    """The quantized activations (``levels`` of them) times the dense weight, in float64."""
    q, dx = quantize_activations_ref(x)
    r, k = x.shape
    xq = (q.double().view(r, k // 32, 32) * dx.double()[..., None]).view(r, k)
    if levels == 2:
        q2 = quantize_residual_ref(x, q, dx)
        xq += (q2.double().view(r, k // 32, 32) * (dx.double() / 256)[..., None]).view(r, k)
    return (xq @ dense.double().t()).float()


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
def test_row_segments_of_mixed_kinds_write_one_output(isa: str) -> None:
    """A fused linear whose rows are Q4_1, Q6_K and Q8_0 segments (Q4_K_M's qkv: Q4_K q/k, Q6_K
    v) equals the float64 product with the concatenated dense weight, and each segment's
    columns equal that segment's product alone, bit for bit."""
    require_isa(isa)
    k = 512
    segs = _segments(k)
    packed = tuple(pack_x16(w, isa) for w in segs)
    dense = torch.cat([dequantize(w) for w in segs])
    gen = torch.Generator().manual_seed(9)
    for rows in (1, 3, 8, 17):
        x = torch.randn(rows, k, generator=gen)
        for levels in (1, 2):
            got = quant_matmul_q8_rows(x, packed, levels=levels)
            assert got.shape == (rows, 108) and got.is_contiguous()
            torch.testing.assert_close(got, _dense_ref(x, dense, levels),
                                       rtol=1e-5, atol=1e-5 * k ** 0.5)
            alone = torch.cat([quant_matmul_q8(x, p, levels=levels) for p in packed], 1)
            assert torch.equal(got, alone), (rows, levels)


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
def test_a_segment_writes_only_its_columns(isa: str) -> None:
    """The GEMMs' output row stride (``ldy``): a segment written into columns 40..40+n of a
    wider output leaves every other column as it was."""
    require_isa(isa)
    x = torch.randn(17, 512, generator=torch.Generator().manual_seed(4))
    for w in (pack_x16(q, isa) for q in _segments(512)):
        y = torch.full((17, 200), float("nan"))
        quant_q8._gemm_into(x, w, y, 40, isa, 2)
        assert torch.isnan(y[:, :40]).all() and torch.isnan(y[:, 40 + w.n:]).all(), w.kind
        assert torch.equal(y[:, 40:40 + w.n], quant_matmul_q8(x, w, levels=2))


@needs_kernel
def test_row_segments_are_checked() -> None:
    a, b = (pack_x16(pack_gguf_blocks("Q8_0", random_blocks("Q8_0", 8, k))) for k in (64, 96))
    with pytest.raises(ValueError, match="share K"):
        quant_matmul_q8_rows(torch.randn(2, 64), (a, b))
    with pytest.raises(ValueError, match="at least one"):
        quant_matmul_q8_rows(torch.randn(2, 64), ())


@needs_kernel
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "Q6_K"])
def test_levels_bound_the_error_against_the_exact_product(kind: str) -> None:
    """Also: two threads give the one-thread result exactly (each output has one owner)."""
    k = 512 if kind == "Q6_K" else 576  # Q6_K: whole blocks of 256
    w = pack_gguf_blocks(kind, random_blocks(kind, 64, k, seed=3))
    packed = pack_x16(w)
    x = torch.randn(8, k, generator=torch.Generator().manual_seed(3)) * 3
    exact = x @ dequantize(w).t()
    for levels, bound in ((1, 2e-2), (2, 1e-4)):
        got = quant_matmul_q8(x, packed, levels=levels)
        err = (got - exact).norm() / exact.norm()
        assert err.item() < bound, (levels, err.item())
        threads = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            assert torch.equal(quant_matmul_q8(x, packed, levels=levels), got)
        finally:
            torch.set_num_threads(threads)


@needs_kernel
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "Q6_K"])
def test_a_rows_result_does_not_depend_on_its_batch(kind: str) -> None:
    """A speculative draft's positions ride in batches of any size (1..8 rows share one pass
    over a weight tile): each row must come out bit for bit as it does alone, or greedy
    decoding with drafts would differ from plain decoding."""
    k = 512 if kind == "Q6_K" else 576
    w = pack_gguf_blocks(kind, random_blocks(kind, 40, k, seed=5))
    packed = pack_x16(w)
    x = torch.randn(23, k, generator=torch.Generator().manual_seed(5))
    alone = torch.cat([quant_matmul_q8(x[i:i + 1], packed, levels=2) for i in range(23)])
    for rows in range(2, 24):
        assert torch.equal(quant_matmul_q8(x[:rows], packed, levels=2), alone[:rows]), rows


def test_activation_quantization_reference() -> None:
    x = torch.zeros(2, 64)
    x[0, :32] = torch.linspace(-2.0, 1.0, 32)  # block 0: amax 2 -> scale 2/127
    q, d = quantize_activations_ref(x)
    assert q.dtype == torch.int8 and d.shape == (2, 2)
    assert q[0, 0].item() == -127 and abs(d[0, 0].item() - 2 / 127) < 1e-7
    assert d[0, 1].item() == 0 and not q[0, 32:].any() and not q[1].any()  # zero blocks


@needs_kernel
def test_dispatch_can_be_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    best = cpu_isa()
    assert best in ISAS and supported_isas()[-1] == best
    monkeypatch.setenv("GRAMMARSERVE_CPU_ISA", "avx2")
    assert cpu_isa() == "avx2"
    monkeypatch.setenv("GRAMMARSERVE_CPU_ISA", "avx9000")
    with pytest.raises(ValueError, match="GRAMMARSERVE_CPU_ISA must be one of avx2"):
        cpu_isa()


@needs_kernel
def test_kernel_rejects_wrong_inputs() -> None:
    packed = pack_x16(pack_gguf_blocks("Q8_0", random_blocks("Q8_0", 8, 64)))
    with pytest.raises(ValueError, match=r"fp32 \[R, 64\]"):
        quant_matmul_q8(torch.randn(2, 32), packed)
    with pytest.raises(ValueError, match="levels must be 1 or 2"):
        quant_matmul_q8(torch.randn(2, 64), packed, levels=3)
    q5_k = QuantWeight("Q5_K", torch.zeros(8, 32, dtype=torch.uint8), torch.ones(8, 1),
                       torch.zeros(8, 1))  # kinds reach the kernel repacked: Q5_K as Q5_1
    with pytest.raises(ValueError, match="no Q5_K path"):
        pack_x16(q5_k)


@needs_kernel
def test_linear_uses_the_int8_kernel_for_decode_batches_only() -> None:
    w = pack_gguf_blocks("Q4_1", random_blocks("Q4_1", 40, 64))
    lin = Linear(64, 40, bias=True)
    lin.quant_x16 = (pack_x16(w, levels=1),)
    with torch.no_grad():
        lin.weight.normal_()  # not the blocks' values: tells which path ran
    for rows in (1, Q8_ROWS):
        x = torch.randn(rows, 64)
        torch.testing.assert_close(lin(x), quant_matmul_q8_ref(x, w, 1) + lin.bias,
                                   rtol=1e-5, atol=1e-4)
    x = torch.randn(Q8_ROWS + 1, 64)
    torch.testing.assert_close(lin(x).contiguous(), x @ lin.weight.t() + lin.bias,
                               rtol=1e-5, atol=1e-4)


@needs_kernel
def test_q6_k_linears_use_the_int8_kernel_or_the_fp32_weight() -> None:
    """The fp32-activation kernel has no Q6_K path: without int8 blocks (``activations="fp32"``)
    a Q6_K linear multiplies its fp32 weight, at any batch size."""
    w = pack_gguf_blocks("Q6_K", random_blocks("Q6_K", 40, 256))
    lin = Linear(256, 40, bias=True)
    lin.quant, lin.quant_rows = w, (w,)
    with torch.no_grad():
        lin.weight.normal_()  # not the blocks' values: tells which path ran
    x = torch.randn(3, 256)
    torch.testing.assert_close(lin(x).contiguous(), x @ lin.weight.t() + lin.bias,
                               rtol=1e-5, atol=1e-4)
    lin.quant_x16 = (pack_x16(w, levels=2),)
    torch.testing.assert_close(lin(x), quant_matmul_q8_ref(x, w, 2) + lin.bias,
                               rtol=1e-5, atol=1e-4)


@needs_kernel
def test_linear_with_row_segments_adds_its_bias_once() -> None:
    segs = _segments(512)
    lin = Linear(512, 108, bias=True)
    lin.quant_rows, lin.quant_x16 = tuple(segs), tuple(pack_x16(w, levels=2) for w in segs)
    x = torch.randn(5, 512)
    want = _dense_ref(x, torch.cat([dequantize(w) for w in segs]), 2) + lin.bias
    torch.testing.assert_close(lin(x), want, rtol=1e-5, atol=1e-4)


def test_activation_modes_are_checked() -> None:
    with pytest.raises(InvalidRequestError, match="quant_activations must be int8x2, int8 or fp32"):
        EngineConfig(quant_activations="int4")  # type: ignore[arg-type]


def test_no_compiler_falls_back_with_a_reason(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    monkeypatch.setattr(quant_q8, "_SOURCE", tmp_path / "quant_q8_cpu.cpp")
    (tmp_path / "quant_q8_cpu.cpp").write_text("this is not C++\n")
    monkeypatch.setenv("GRAMMARSERVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", "c++" if shutil.which("c++") else "/nonexistent/c++")
    assert cpu_isa() is None and supported_isas() == []
    assert "cannot build quant_q8_cpu.cpp for avx2" in (quant_q8.kernel_error() or "")
