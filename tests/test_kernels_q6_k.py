"""GGUF Q6_K in its own kind, kept at 6.625 bits a weight in the x16 layout of the int8 kernels
(``kernels/quant_q8_cpu.cpp``: 4-bit nibbles as Q4_1's, a plane of high bit pairs, int8 scales per
16 and fp32 ``d`` per 256, in place of a byte a value and fp32 ``d * scale`` per 16: 10 bits).
Dequantizing equals ``gguf.quants`` bit for bit, the x16 layout unpacks exactly, the panel
dequantizer reads it bit for bit on every build (the kernel against its reference:
``test_kernels_q8.py``)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from grammarserve_kernels.quant import LAYOUT_BYTES_PER_WEIGHT, dequantize, pack_gguf_blocks
from grammarserve_kernels.quant_panel import dequantize_x16
from grammarserve_kernels.quant_q8 import ISAS, pack_x16, unpack_x16
from isa_helpers import require_isa
from quant_helpers import random_blocks

can_build = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") and bool(
    shutil.which("c++"))
needs_kernel = pytest.mark.skipif(not can_build, reason="needs an AVX2 CPU and a C++ compiler")


def _edge_blocks(n: int, k: int, seed: int) -> np.ndarray:
    """``random_blocks``' edge values (d = 0; scales -128 and 127; every value 0, every 63) plus
    a block whose high bit pairs are all 3 over random nibbles."""
    raw = random_blocks("Q6_K", n, k, seed=seed).reshape(n, -1, 210)
    raw[n - 1, 0, 128:192] = 0xFF
    return raw.reshape(n, -1)


@pytest.mark.parametrize("k", [256, 768])
def test_dequantize_equals_gguf_bit_for_bit(k: int) -> None:
    raw = _edge_blocks(21, k, k)
    w = pack_gguf_blocks("Q6_K", raw)
    assert w.kind == "Q6_K" and w.shape == (21, k)
    expected = gguf_dequantize(raw, GGMLQuantizationType.Q6_K).reshape(21, k)
    got = dequantize(w).numpy()
    assert np.array_equal(got.view(np.uint32), expected.astype(np.float32).view(np.uint32))


@needs_kernel
@pytest.mark.parametrize("n", [1, 16, 21, 37])
def test_x16_layout_unpacks_exactly_at_6_625_bits(n: int) -> None:
    w = pack_gguf_blocks("Q6_K", _edge_blocks(n, 512, n))
    p = pack_x16(w, "avx2")
    assert p.qs.numel() + 4 * p.d.numel() + p.m.numel() == -(-n // 16) * 16 * 512 * 6.625 / 8
    assert LAYOUT_BYTES_PER_WEIGHT["Q6_K"] * 8 == 6.625
    back = unpack_x16(p)
    assert back.kind == "Q6_K"
    for part in ("qs", "d", "m"):
        assert torch.equal(getattr(back, part), getattr(w, part)), (n, part)


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
def test_panels_dequantize_bit_for_bit(isa: str) -> None:
    require_isa(isa)
    w = pack_gguf_blocks("Q6_K", _edge_blocks(37, 512, 3))
    p = pack_x16(w, isa)
    exact = dequantize(w)
    assert torch.equal(dequantize_x16(p).view(torch.int32), exact.view(torch.int32))
    part = dequantize_x16(p, rows=slice(3, 33))
    assert torch.equal(part.view(torch.int32), exact[3:33].view(torch.int32))
    bf16 = dequantize_x16(p, torch.bfloat16)
    assert torch.equal(bf16.view(torch.int16), exact.bfloat16().view(torch.int16))
