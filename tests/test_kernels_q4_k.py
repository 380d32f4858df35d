"""The int8-activation kernel's Q4_K kind (``kernels/quant_q8_cpu.cpp``): GGUF Q4_K kept as its
own super-blocks (4-bit nibbles as Q4_1, u8 6-bit scale and min per 32, fp32 d and dmin per 256:
4.75 bits a weight against the Q4_1 repack's 6). Dequantizing equals ``gguf.quants`` bit for bit;
every instruction-set build equals the float64 reference of the same quantized product and the
Q4_1 repack of the same blocks bit for bit; the x16 layout unpacks exactly; the panel
dequantizer reads it; it runs as a row segment beside Q6_K."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from grammarserve_kernels.quant import (
    LAYOUT_BYTES_PER_WEIGHT,
    as_q4_1,
    dequantize,
    pack_gguf_blocks,
    quant_matmul,
    quant_matmul_ref,
)
from grammarserve_kernels.quant_panel import dequantize_x16, panel_matmul
from grammarserve_kernels.quant_q8 import (
    ISAS,
    pack_x16,
    quant_matmul_q8,
    quant_matmul_q8_ref,
    quant_matmul_q8_rows,
    quant_matmul_q8_rows_ref,
    unpack_x16,
)
from isa_helpers import require_isa
from quant_helpers import random_blocks

can_build = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") and bool(
    shutil.which("c++"))
needs_kernel = pytest.mark.skipif(not can_build, reason="needs an AVX2 CPU and a C++ compiler")

ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 64)
N = 37  # two tiles of 16 rows and a partial one


def _weight(n: int, k: int, seed: int):
    raw = random_blocks("Q4_K", n, k, seed=seed)
    return raw, pack_gguf_blocks("Q4_K", raw)


@pytest.mark.parametrize("k", [256, 512])
def test_dequantize_equals_gguf_bit_for_bit(k: int) -> None:
    """With the edge blocks of ``random_blocks`` (d = 0; every scale and min 63) and
    zeros/all-ones nibbles."""
    raw, w = _weight(N, k, k)
    raw = raw.reshape(N, -1, 144)
    raw[1, 0, 16:] = 0x00
    raw[2, -1, 16:] = 0xFF
    raw[3, 0, 2:4] = 0  # dmin = 0
    raw = raw.reshape(N, -1)
    w = pack_gguf_blocks("Q4_K", raw)
    assert w.kind == "Q4_K" and w.shape == (N, k)
    assert w.qs.shape == (N, k // 2) and w.d.shape == (N, k // 128) and w.m.shape == (N, k // 16)
    expected = gguf_dequantize(raw, GGMLQuantizationType.Q4_K).reshape(N, k)
    got = dequantize(w).numpy()
    assert np.array_equal(got.view(np.uint32), expected.astype(np.float32).view(np.uint32))
    q41 = as_q4_1(w)
    assert q41.kind == "Q4_1"
    assert np.array_equal(dequantize(q41).numpy().view(np.uint32), got.view(np.uint32))


def test_layout_bytes_are_what_the_packed_weight_holds() -> None:
    _, w = _weight(16, 512, 1)
    assert LAYOUT_BYTES_PER_WEIGHT["Q4_K"] * 8 == 4.75
    assert w.nbytes() == LAYOUT_BYTES_PER_WEIGHT["Q4_K"] * 16 * 512
    p = pack_x16(w, "avx2") if can_build else None
    if p is not None:
        assert p.qs.numel() + 4 * p.d.numel() + p.m.numel() == w.nbytes()


@needs_kernel
@pytest.mark.parametrize("n", [1, 16, 21, N])
def test_x16_layout_unpacks_exactly(n: int) -> None:
    _, w = _weight(n, 512, n)
    p = pack_x16(w, "avx2")
    tiles = -(-n // 16)
    assert p.qs.shape == (tiles, 16, 4, 64) and p.d.shape == (tiles, 2, 2, 16)
    assert p.m.shape == (tiles, 16, 2, 16) and p.m.dtype == torch.uint8
    back = unpack_x16(p)
    assert back.kind == "Q4_K"
    for part in ("qs", "d", "m"):
        assert torch.equal(getattr(back, part), getattr(w, part)), (n, part)


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("k", [256, 512])
def test_kernel_matches_reference_and_the_q4_1_repack(isa: str, k: int) -> None:
    """Within the reference's rounding, and bit for bit the Q4_1 kernel on the same blocks
    (the same fp32 scales and offsets, the offset subtracted in one rounding)."""
    require_isa(isa)  # skips an ISA this CPU lacks; fails where its build failed
    _, w = _weight(N, k, k)
    packed, q41 = pack_x16(w, isa), pack_x16(as_q4_1(w), isa)
    gen = torch.Generator().manual_seed(k)
    for rows in ROWS:
        x = torch.randn(rows, k, generator=gen)
        for levels in (1, 2):
            got = quant_matmul_q8(x, packed, levels=levels)
            assert got.shape == (rows, N) and got.is_contiguous()
            torch.testing.assert_close(got, quant_matmul_q8_ref(x, w, levels),
                                       rtol=1e-5, atol=1e-5 * k ** 0.5)
            assert torch.equal(got, quant_matmul_q8(x, q41, levels=levels)), (rows, levels)


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
def test_segments_beside_q6_k_write_one_output(isa: str) -> None:
    """Q4_K_M's qkv: Q4_K q/k rows and Q6_K v rows, each segment's columns its product alone."""
    require_isa(isa)
    k = 512
    segs = (pack_gguf_blocks("Q4_K", random_blocks("Q4_K", 21, k, seed=4)),
            pack_gguf_blocks("Q6_K", random_blocks("Q6_K", 18, k, seed=5)),
            pack_gguf_blocks("Q4_K", random_blocks("Q4_K", 5, k, seed=6)))
    packed = tuple(pack_x16(w, isa) for w in segs)
    gen = torch.Generator().manual_seed(3)
    for rows in (1, 8, 9):
        x = torch.randn(rows, k, generator=gen)
        for levels in (1, 2):
            got = quant_matmul_q8_rows(x, packed, levels=levels)
            torch.testing.assert_close(got, quant_matmul_q8_rows_ref(x, segs, levels),
                                       rtol=1e-5, atol=1e-4)
            alone = torch.cat([quant_matmul_q8(x, p, levels=levels) for p in packed], 1)
            assert torch.equal(got, alone), (rows, levels)


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
def test_panels_dequantize_bit_for_bit(isa: str) -> None:
    require_isa(isa)
    _, w = _weight(N, 512, 7)
    p = pack_x16(w, isa)
    exact = dequantize(w)
    assert torch.equal(dequantize_x16(p).view(torch.int32), exact.view(torch.int32))
    part = dequantize_x16(p, rows=slice(5, 30))
    assert torch.equal(part.view(torch.int32), exact[5:30].view(torch.int32))
    bf16 = dequantize_x16(p, torch.bfloat16)
    assert torch.equal(bf16.view(torch.int16), exact.bfloat16().view(torch.int16))
    x = torch.randn(6, 512, generator=torch.Generator().manual_seed(8))
    torch.testing.assert_close(panel_matmul(x, (p,), torch.float32), x @ exact.t(),
                               rtol=1e-5, atol=1e-4)


@needs_kernel
def test_the_fp32_kernel_takes_q4_k_through_its_q4_1_repack() -> None:
    _, w = _weight(N, 512, 9)
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(quant_matmul(x, w), quant_matmul_ref(x, w), rtol=1e-5,
                               atol=1e-4)
