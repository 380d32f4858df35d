"""GGUF files whose linears are Q5_K, Q5_1, Q5_0 (Q5_K_M files, and the fallbacks llama.cpp's
K-quant mixes take for rows not a multiple of 256): every linear decodes from its own blocks
(Q5_K and Q5_1 into the Q5_1 layout, Q5_0 into Q8_0, all bit for bit), none is left fp32, and
the one-call decode stack runs the Q5_1 segments like the layers do."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch
from gguf import GGUFReader
from grammarserve_kernels.quant import dequantize

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import model_shapes
from test_kquants import STACK_TOLERANCE, _decode_steps

from grammarserve.models.linear import Linear
from grammarserve.models.loader import LoadedModel, load_model

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(
        torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512")
        or not shutil.which("c++"), reason="needs an AVX2 CPU and a C++ compiler"),
]
needs_q5_k_m = pytest.mark.skipif("Q5_K_M" not in model_shapes.QTYPES,
                                  reason="benchmarks/model_shapes.py writes no Q5_K_M mix")


def _load_both(shape: str, qtype: str, out: Path) -> tuple[LoadedModel, dict[str, torch.Tensor]]:
    """The model with its blocks, and the fp32 weights gguf dequantizes, by linear name."""
    path = model_shapes.make_gguf(shape, out, qtype=qtype)
    dense = load_model(str(path), cache_dir=out / "cache", gguf_blocks=False)
    expected = {n: m.weight for n, m in dense.model.named_modules() if isinstance(m, Linear)}
    return load_model(str(path), cache_dir=out / "cache"), expected


def _check_every_linear(loaded: LoadedModel, expected: dict[str, torch.Tensor]
                        ) -> dict[str, tuple[str, ...]]:
    """Every linear has blocks (the one copy) standing for exactly gguf's weight; returns the
    kinds of its segments by name."""
    linears = {n: m for n, m in loaded.model.named_modules() if isinstance(m, Linear)}
    kinds = {n: tuple(q.kind for q in m.quant_rows) for n, m in linears.items()}
    for name, linear in linears.items():
        assert linear.quant_x16 is not None and len(linear.quant_x16) == len(kinds[name]), name
        assert linear.weight.device.type == "meta", name
        weight = torch.cat([dequantize(q) for q in linear.quant_rows])
        assert torch.equal(weight.view(torch.int32), expected[name].view(torch.int32)), name
    x = torch.randn(3, linears["lm_head"].in_features)
    torch.testing.assert_close(linears["lm_head"](x), x @ expected["lm_head"].t(), rtol=1e-3,
                               atol=1e-3)
    return kinds


def test_a_q4_k_m_model_with_rows_not_whole_super_blocks_runs_its_q5_0_blocks(
        tmp_path: Path) -> None:
    """SmolLM2's shape (hidden 128 here, 576 in the real model): Q4_K_M falls back to Q5_0 for
    the rows of 128 (and to Q8_0 for Q6_K's), which load as Q8_0 blocks, not fp32."""
    loaded, expected = _load_both("smollm2-tiny", "Q4_K_M", tmp_path)
    kinds = _check_every_linear(loaded, expected)
    assert kinds["layers.0.self_attn.qkv_proj"] == ("Q8_0",)  # Q5_0 q, k, v
    assert kinds["layers.0.mlp.down_proj"] == ("Q4_K",)  # K = 256
    assert kinds["layers.1.mlp.down_proj"] == ("Q6_K",)


@needs_q5_k_m
def test_every_linear_of_a_q5_k_m_model_decodes_from_its_blocks(tmp_path: Path) -> None:
    loaded, expected = _load_both("smollm2-ktiny", "Q5_K_M", tmp_path)
    path = model_shapes.cached_path("smollm2-ktiny", tmp_path, qtype="Q5_K_M")
    types = {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}
    assert types["blk.1.attn_v.weight"] == "Q5_K" and types["blk.0.attn_v.weight"] == "Q6_K"
    kinds = _check_every_linear(loaded, expected)
    assert kinds["layers.1.self_attn.qkv_proj"] == ("Q5_1",)  # Q5_K q, k, v: one segment
    assert kinds["layers.0.self_attn.qkv_proj"] == ("Q5_1", "Q6_K")
    assert kinds["layers.0.mlp.down_proj"] == ("Q6_K",) and kinds["lm_head"] == ("Q6_K",)
    stack = loaded.model.decode_stack
    assert stack is not None
    stacked = _decode_steps(loaded, decode_stack=True)
    layered = _decode_steps(loaded, decode_stack=False)
    for a, b in zip(stacked, layered, strict=True):
        assert (a - b).abs().max().item() < STACK_TOLERANCE


@needs_q5_k_m
def test_a_q5_k_m_model_with_rows_not_whole_super_blocks_runs_its_q5_1_blocks(
        tmp_path: Path) -> None:
    loaded, expected = _load_both("smollm2-tiny", "Q5_K_M", tmp_path)
    kinds = _check_every_linear(loaded, expected)
    assert kinds["layers.0.self_attn.qkv_proj"] == ("Q5_1",)  # Q5_1 q, k, v
    assert kinds["layers.1.self_attn.qkv_proj"] == ("Q5_1", "Q8_0")  # Q8_0 v (Q6_K's)
    assert kinds["layers.0.mlp.down_proj"] == ("Q5_1",)  # K = 256: Q5_K
