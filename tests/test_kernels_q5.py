"""The int8-activation kernel's Q5_1 kind (``kernels/quant_q8_cpu.cpp``: 4-bit nibbles as Q4_1
plus a plane of high bits, fp32 d and m per 32), which GGUF Q5_K (Q5_K_M files) and Q5_1 (their
fallback for rows not a multiple of 256) repack into losslessly: every instruction-set build
equals the float64 reference of the same quantized product, the x16 layout unpacks to the row
layout exactly, it runs as a row segment beside other kinds, and Q4_0 / Q5_0 (repacked into
Q4_1 / Q8_0) run on those kinds' kernels."""

from __future__ import annotations

import shutil

import pytest
import torch
from grammarserve_kernels.quant import LAYOUT_BYTES_PER_WEIGHT, dequantize, pack_gguf_blocks
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
pytestmark = pytest.mark.skipif(not can_build, reason="needs an AVX2 CPU and a C++ compiler")

ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 64)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind,k", [("Q5_K", 512), ("Q5_1", 96), ("Q4_0", 96), ("Q5_0", 96)])
def test_kernel_matches_reference(isa: str, kind: str, k: int) -> None:
    """With the edge blocks of ``random_blocks`` (d = 0, every q 0, every q 31; Q5_K's scales
    and mins 63) and N = 37: two tiles of 16 rows and a partial one."""
    require_isa(isa)  # skips an ISA this CPU lacks; fails where its build failed
    w = pack_gguf_blocks(kind, random_blocks(kind, 37, k, seed=k))
    packed = pack_x16(w, isa)
    if w.kind == "Q5_1":
        assert packed.qs.shape == (3, k // 32, 5, 64) and packed.m.shape == (3, k // 32, 16)
    gen = torch.Generator().manual_seed(k)
    for rows in ROWS:
        x = torch.randn(rows, k, generator=gen)
        for levels in (1, 2):
            got = quant_matmul_q8(x, packed, levels=levels)
            assert got.shape == (rows, 37) and got.is_contiguous()
            torch.testing.assert_close(got, quant_matmul_q8_ref(x, w, levels),
                                       rtol=1e-5, atol=1e-5 * k ** 0.5)


@pytest.mark.parametrize("kind", ["Q5_K", "Q5_1", "Q6_K", "Q4_K", "Q4_0", "Q5_0", "Q8_0"])
def test_x16_layout_unpacks_exactly(kind: str) -> None:
    k = 256 if kind.endswith("_K") else 64
    for n in (1, 16, 21):
        w = pack_gguf_blocks(kind, random_blocks(kind, n, k, seed=n))
        back = unpack_x16(pack_x16(w, "avx2"))
        assert back.kind == w.kind, kind
        for part in ("qs", "d", "m"):
            assert torch.equal(getattr(back, part), getattr(w, part)), (kind, n, part)
        assert torch.equal(dequantize(back), dequantize(w))


@pytest.mark.parametrize("isa", ISAS)
def test_q5_segments_beside_other_kinds_write_one_output(isa: str) -> None:
    """A fused linear of Q5_1 (from Q5_K), Q6_K, Q4_K and Q5_1 (from Q5_1) row
    segments (Q5_K_M's qkv: Q5_K q/k, Q6_K v): each segment's columns equal its product alone."""
    require_isa(isa)
    k = 256
    segs = tuple(pack_gguf_blocks(kind, random_blocks(kind, n, k, seed=n))
                 for kind, n in (("Q5_K", 21), ("Q6_K", 18), ("Q4_K", 5), ("Q5_1", 40)))
    packed = tuple(pack_x16(w, isa) for w in segs)
    gen = torch.Generator().manual_seed(2)
    for rows in (1, 8, 9):
        x = torch.randn(rows, k, generator=gen)
        for levels in (1, 2):
            got = quant_matmul_q8_rows(x, packed, levels=levels)
            torch.testing.assert_close(got, quant_matmul_q8_rows_ref(x, segs, levels),
                                       rtol=1e-5, atol=1e-4)
            alone = torch.cat([quant_matmul_q8(x, p, levels=levels) for p in packed], 1)
            assert torch.equal(got, alone), (rows, levels)


def test_levels_bound_the_error_and_rows_do_not_depend_on_their_batch() -> None:
    w = pack_gguf_blocks("Q5_K", random_blocks("Q5_K", 40, 512, seed=3))
    packed = pack_x16(w)
    x = torch.randn(12, 512, generator=torch.Generator().manual_seed(3)) * 3
    exact = x @ dequantize(w).t()
    for levels, bound in ((1, 2e-2), (2, 1e-4)):
        got = quant_matmul_q8(x, packed, levels=levels)
        assert ((got - exact).norm() / exact.norm()).item() < bound, levels
    alone = torch.cat([quant_matmul_q8(x[i:i + 1], packed, levels=2) for i in range(12)])
    for rows in range(2, 13):
        assert torch.equal(quant_matmul_q8(x[:rows], packed, levels=2), alone[:rows]), rows


def test_layout_bytes_are_what_the_packed_weight_holds() -> None:
    """``LAYOUT_BYTES_PER_WEIGHT`` (the memory estimate's) against the tensors of a repacked
    weight: Q5_K and Q5_1 7 bits a weight, Q4_0 6, Q5_0 9."""
    for kind in ("Q5_K", "Q5_1", "Q4_0", "Q5_0"):
        w = pack_gguf_blocks(kind, random_blocks(kind, 16, 512))
        assert w.nbytes() == LAYOUT_BYTES_PER_WEIGHT[kind] * 16 * 512, kind
        assert pack_x16(w, "avx2").qs.numel() + 4 * (w.d.numel() + w.m.numel()) == w.nbytes()
