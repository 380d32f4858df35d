"""The one-call decoder stack for decode steps (``kernels/decode_stack_cpu.cpp``) against its torch
reference on random weights: every weight kind (Q6_K beside Q4_1 / Q8_0 in one layer, a qkv of
Q4_1 and Q6_K row segments, Q4_K beside Q6_K, Q5_1 from Q5_K and Q5_1 beside Q6_K and the Q4_0 /
Q5_0 repacks), a shared prefix or none, several tokens of one row (jump-forward spans), a qkv
bias; the pool and mirror entries it writes; every build."""

from __future__ import annotations

import shutil

import pytest
import torch
from grammarserve_kernels.decode_stack import (
    DecodeStack,
    StackDims,
    StackHead,
    StackKV,
    StackLayer,
    StackLinear,
    decode_stack_head_ref,
    decode_stack_ref,
)
from grammarserve_kernels.quant import pack_gguf_blocks
from grammarserve_kernels.quant_q8 import pack_x16, supported_isas
from isa_helpers import require_isa
from quant_helpers import random_blocks

can_build = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") and bool(
    shutil.which("c++"))
pytestmark = pytest.mark.skipif(not can_build, reason="needs an AVX2 CPU and a C++ compiler")

DIMS = StackDims(hidden=128, heads=4, kv_heads=2, head_dim=64, inter=96, eps=1e-5)
DIMS_256 = StackDims(hidden=256, heads=4, kv_heads=2, head_dim=64, inter=256, eps=1e-5)  # Q6_K


def _linear(kind: str, n: int | list[int], k: int, seed: int, isa: str,
            bias: bool = False) -> StackLinear:
    """``kind``: one, or row segments joined by ``+`` with ``n`` their row counts."""
    kinds, ns = kind.split("+"), n if isinstance(n, list) else [n]
    quant = tuple(pack_gguf_blocks(kd, random_blocks(kd, rows, k, seed=seed + i))
                  for i, (kd, rows) in enumerate(zip(kinds, ns, strict=True)))
    b = torch.randn(sum(ns), generator=torch.Generator().manual_seed(seed)) if bias else None
    return StackLinear(tuple(pack_x16(q, isa=isa) for q in quant), b)


def _layers(kind: str, isa: str, n: int = 2, bias: bool = False,
            dims: StackDims = DIMS) -> list[StackLayer]:
    """``kind``: one for every projection, or four comma-separated (qkv, o, gate_up, down); a
    qkv of two kinds ``A+B``: q and k rows of A, v rows of B (Q4_K_M's mixed layers)."""
    d, gen = dims, torch.Generator().manual_seed(7)
    width = (d.heads + 2 * d.kv_heads) * d.head_dim
    kinds = kind.split(",") if "," in kind else [kind] * 4
    v_rows = d.kv_heads * d.head_dim
    qkv_rows = [width - v_rows, v_rows] if "+" in kinds[0] else width
    return [StackLayer(1 + 0.1 * torch.randn(d.hidden, generator=gen),
                       1 + 0.1 * torch.randn(d.hidden, generator=gen),
                       _linear(kinds[0], qkv_rows, d.hidden, 10 * i + 1, isa, bias),
                       _linear(kinds[1], d.hidden, d.heads * d.head_dim, 10 * i + 2, isa),
                       _linear(kinds[2], 2 * d.inter, d.hidden, 10 * i + 3, isa),
                       _linear(kinds[3], d.hidden, d.inter, 10 * i + 4, isa)) for i in range(n)]


def _kv(layers: int, qb: list[int], qpos: list[int], prefix: int, rows: int = 3,
        cap: int = 32, dims: StackDims = DIMS) -> StackKV:
    d, gen = dims, torch.Generator().manual_seed(3)
    rand = lambda *shape: torch.randn(*shape, generator=gen)
    slots = torch.randperm(40, generator=gen)[:len(qb)] + 1
    return StackKV([rand(41, d.kv_heads, d.head_dim) for _ in range(layers)],
                   [rand(41, d.kv_heads, d.head_dim) for _ in range(layers)],
                   [rand(rows, d.kv_heads, cap // 16, d.head_dim, 16) for _ in range(layers)],
                   [rand(rows, d.kv_heads, cap, d.head_dim) for _ in range(layers)],
                   [rand(d.kv_heads, d.head_dim, prefix) for _ in range(layers)] if prefix else [],
                   [rand(d.kv_heads, prefix, d.head_dim) for _ in range(layers)] if prefix else [],
                   slots, torch.tensor(qb), torch.tensor(qpos))


def _clone(kv: StackKV) -> StackKV:
    copy = lambda ts: [t.clone() for t in ts]
    return StackKV(copy(kv.pool_k), copy(kv.pool_v), copy(kv.mirror_k), copy(kv.mirror_v),
                   kv.kt, kv.vs, kv.slots, kv.qb, kv.qpos)


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3 * float(want.abs().max()))


CASES = [  # kind(s), mirror row and position of each token, shared prefix length, qkv bias
    ("Q8_0", [0], [5], 0, False),
    ("Q4_1", [0, 1, 2], [3, 9, 0], 70, False),
    ("Q8_0", [0, 0, 0, 1], [4, 5, 6, 2], 33, True),  # a span of three tokens in row 0
    ("Q6_K", [0, 1], [7, 2], 20, True),  # hidden and inter 256: Q6_K's rows are whole 256s
    # Q6_K o and down beside other kinds; its Q8_0 gate values fall far below -88, where
    # exp(-gate) overflows fp32 (SiLU must still give ~0)
    ("Q4_1,Q6_K,Q8_0,Q6_K", [0, 0, 1], [1, 2, 4], 0, False),
    # qkv as two row segments, Q4_1 q/k + Q6_K v (Q4_K_M's use_more_bits layers), with a bias
    ("Q4_1+Q6_K,Q4_1,Q4_1,Q6_K", [0, 1, 1], [3, 5, 6], 20, True),
    # Q5_K_M's mix: Q5_K (the Q5_1 kind) q/k + Q6_K v, Q5_K o and gate/up, Q6_K down
    ("Q5_K+Q6_K,Q5_K,Q5_K,Q6_K", [0, 1, 1], [3, 5, 6], 20, True),
    # Q4_K_M's mix in Q4_K's own kind: Q4_K q/k + Q6_K v, Q4_K o and gate/up, Q6_K down
    ("Q4_K+Q6_K,Q4_K,Q4_K,Q6_K", [0, 1, 1], [3, 5, 6], 20, True),
    # small models' fallbacks for rows not a multiple of 256: Q5_1 (as Q5_1), Q5_0 (as Q8_0),
    # and old files' Q4_0 (as Q4_1)
    ("Q5_1+Q5_0,Q4_0,Q5_1,Q5_0", [0, 0, 1], [1, 2, 4], 0, False),
]


@pytest.mark.parametrize("isa", ["avx2", "avx512vnni"])
@pytest.mark.parametrize("case", CASES, ids=[str(c[:4]) for c in CASES])
def test_decode_stack_matches_reference(isa: str, case: tuple) -> None:
    require_isa(isa)
    kind, qb, qpos, prefix, bias = case
    dims = DIMS_256 if "_K" in kind else DIMS
    layers = _layers(kind, isa, bias=bias, dims=dims)
    gen = torch.Generator().manual_seed(11)
    t = len(qb)
    h = torch.randn(t, dims.hidden, generator=gen)
    pos = torch.tensor(qpos, dtype=torch.float32)[:, None] + prefix
    freqs = pos * (1.0 / 10000 ** (torch.arange(0, dims.head_dim, 2) / dims.head_dim))
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos().contiguous(), emb.sin().contiguous()
    kv = _kv(len(layers), qb, qpos, prefix, dims=dims)
    kv_ref = _clone(kv)
    want = decode_stack_ref(dims, layers, h.clone(), cos, sin, kv_ref)
    head = StackHead(1 + 0.1 * torch.randn(dims.hidden, generator=gen),
                     _linear(kind.split(",")[-1], 200, dims.hidden, 99, isa))
    rows = torch.tensor([i for i in range(t) if i == t - 1 or qb[i] != qb[i + 1]])  # last of each
    got = h.clone()
    logits = DecodeStack(dims, layers, head).run(got, cos, sin, kv, rows)
    # int8 activations: a rounding flip of one quantized value moves a product by ~1e-4 of the
    # row's scale, so the bound is relative to the largest value
    _close(got, want)
    assert logits is not None and logits.shape == (len(rows), 200)
    _close(logits, decode_stack_head_ref(dims, head, want, rows))
    for name in ("pool_k", "pool_v", "mirror_k", "mirror_v"):
        for a, b in zip(getattr(kv, name), getattr(kv_ref, name)):
            _close(a, b)


def test_decode_stack_refuses_mixed_builds_and_odd_heads() -> None:
    isas = supported_isas()
    if len(isas) < 2:
        pytest.skip("one instruction set only")
    layers = _layers("Q8_0", isas[0], n=1) + _layers("Q8_0", isas[-1], n=1)
    with pytest.raises(ValueError, match="one build"):
        DecodeStack(DIMS, layers)
    with pytest.raises(ValueError, match="head_dim"):
        DecodeStack(StackDims(128, 4, 2, 32, 96, 1e-5), layers[:1])


def test_decode_stack_head_is_optional_and_checks_rows() -> None:
    isa = supported_isas()[-1]
    layers = _layers("Q8_0", isa, n=1)
    gen = torch.Generator().manual_seed(5)
    h = torch.randn(2, DIMS.hidden, generator=gen)
    pos = torch.tensor([[3.0], [4.0]])
    freqs = pos * (1.0 / 10000 ** (torch.arange(0, DIMS.head_dim, 2) / DIMS.head_dim))
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    kv = _kv(1, [0, 1], [3, 4], 0)
    got = h.clone()
    assert DecodeStack(DIMS, layers).run(got, cos, sin, kv, torch.tensor([0, 1])) is None
    assert not torch.equal(got, h)  # the layers ran
    head = StackHead(torch.ones(DIMS.hidden), _linear("Q8_0", 64, DIMS.hidden, 5, isa))
    before = h.clone()
    with pytest.raises(ValueError, match="logit_rows"):
        DecodeStack(DIMS, layers, head).run(h, cos, sin, _kv(1, [0, 1], [3, 4], 0),
                                            torch.tensor([0, 2]))
    assert torch.equal(h, before)  # refused before any layer ran
    with pytest.raises(ValueError, match="no bias"):
        DecodeStack(DIMS, layers, StackHead(torch.ones(DIMS.hidden),
                                            _linear("Q8_0", 64, DIMS.hidden, 5, isa, bias=True)))
