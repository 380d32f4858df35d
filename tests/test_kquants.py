"""K-quant GGUF files (Q4_K_M, what users download): the numpy quantizers of
``benchmarks/kquants.py`` write bytes gguf reads back, llama.cpp's type mix, and a Q4_K_M model
whose linears all decode from their own blocks: Q4_K and Q6_K in their own kinds (lossless), a
fused q/k/v of both as two row segments."""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize as gguf_dequantize
from grammarserve_kernels.quant import dequantize, pack_gguf_blocks
from grammarserve_kernels.quant_q8 import ISAS, cpu_isa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import kquants
import model_shapes
from quant_helpers import random_blocks

from grammarserve.attention.backend import TorchSDPABackend
from grammarserve.attention.kv_pool import KVPool, ReqToTokenPool
from grammarserve.engine.model_runner import BatchEntry, ModelRunner
from grammarserve.models.linear import Linear
from grammarserve.models.loader import LoadedModel, load_model

needs_kernel = pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512") or not shutil.which("c++"),
    reason="needs an AVX2 CPU and a C++ compiler")

#: The one-call decode stack against the same steps layer by layer (the parity tests' bound:
#: the stack's RMSNorm sums in another order, which can move an activation across an int8 step).
STACK_TOLERANCE = 2e-2


@pytest.mark.parametrize("kind,rms", [("Q4_K", 0.1), ("Q6_K", 0.03)])
def test_quantizers_write_blocks_gguf_reads_back(kind: str, rms: float) -> None:
    x = np.random.default_rng(0).standard_normal((16, 768)).astype(np.float32) * 0.05
    x[0, :256] = 0.0
    raw = kquants.QUANTIZERS[kind](x)
    assert raw.dtype == np.uint8 and raw.shape == (16, 3 * (144 if kind == "Q4_K" else 210))
    back = gguf_dequantize(raw, GGMLQuantizationType[kind]).reshape(x.shape)
    assert np.all(back[0, :256] == 0.0)
    assert np.linalg.norm(back - x) / np.linalg.norm(x) < rms
    with pytest.raises(ValueError, match="whole blocks of 256"):
        kquants.QUANTIZERS[kind](x[:, :300])


def test_q5_k_quantizer_writes_blocks_gguf_reads_back() -> None:
    x = np.random.default_rng(1).standard_normal((16, 768)).astype(np.float32) * 0.05
    x[0, :256] = 0.0
    raw = kquants.quantize_q5_k(x)
    assert raw.dtype == np.uint8 and raw.shape == (16, 3 * 176)
    back = gguf_dequantize(raw, GGMLQuantizationType.Q5_K).reshape(x.shape)
    assert np.all(back[0, :256] == 0.0)
    assert np.linalg.norm(back - x) / np.linalg.norm(x) < 0.05  # half Q4_K's step
    w = pack_gguf_blocks("Q5_K", raw)  # and the Q5_1 layout holds exactly those values
    assert np.array_equal(dequantize(w).numpy().view(np.uint32), back.view(np.uint32))
    assert kquants.q5_k_m_type("blk.5.attn_q.weight", 24, tied=True) == "Q5_K"
    assert kquants.q5_k_m_type("blk.5.attn_v.weight", 24, tied=True) == "Q6_K"
    assert kquants.q5_k_m_type("blk.4.attn_v.weight", 24, tied=True) == "Q5_K"


@pytest.mark.parametrize("kind,layout", [("Q4_0", "Q4_1"), ("Q5_0", "Q8_0"), ("Q5_1", "Q5_1"),
                                         ("Q5_K", "Q5_1")])
def test_other_types_repack_into_a_kernel_layout_losslessly(kind: str, layout: str) -> None:
    """Q4_0, Q5_0 (small models' Q4_K_M fallback for rows not a multiple of 256), Q5_1 (Q5_K_M's)
    and Q5_K dequantize from their layout to gguf's values bit for bit, with the edge blocks of
    ``random_blocks`` (d = 0, d < 0, every q 0, every q at its largest). Q4_0's only difference is
    the sign of a zero (gguf's ``d * 0`` with d < 0 is -0.0, the Q4_1 layout's ``d * 8 + m`` +0.0)."""
    k = 768 if kind == "Q5_K" else 512
    raw = random_blocks(kind, 9, k, seed=11)
    w = pack_gguf_blocks(kind, raw)
    assert w.kind == layout and w.shape == (9, k)
    want = gguf_dequantize(raw, GGMLQuantizationType[kind]).reshape(9, k).astype(np.float32)
    got = dequantize(w).numpy()
    if kind == "Q4_0":
        assert np.array_equal(got, want)  # as values: -0.0 == 0.0
        assert np.all(got.view(np.uint32)[got != 0] == want.view(np.uint32)[want != 0])
        got, want = got + np.float32(0), want + np.float32(0)  # -0.0 -> +0.0
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    if kind != "Q5_K":
        assert len(np.unique(want[0, :32])) == 1  # the d = 0 block: 0 (or m for Q5_1)


def test_q4_k_m_mix_is_llama_cpps() -> None:
    more_bits = {i for i in range(24)
                 if kquants.q4_k_m_type(f"blk.{i}.ffn_down.weight", 24, tied=True) == "Q6_K"}
    assert more_bits == {0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23}
    assert kquants.q4_k_m_type("blk.5.attn_v.weight", 24, tied=True) == "Q6_K"
    assert kquants.q4_k_m_type("blk.5.attn_q.weight", 24, tied=True) == "Q4_K"
    assert kquants.q4_k_m_type("token_embd.weight", 24, tied=True) == "Q6_K"
    assert kquants.q4_k_m_type("token_embd.weight", 24, tied=False) == "Q4_K"


@pytest.fixture(scope="module")
def q4_k_m_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Q4_K_M GGUF of the ``smollm2-ktiny`` shape (the smollm2 vocabulary is the embedded
    model's)."""
    out = tmp_path_factory.mktemp("q4_k_m")
    path = model_shapes.make_gguf("smollm2-ktiny", out, qtype="Q4_K_M")
    types = {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}
    assert types["blk.1.attn_v.weight"] == "Q4_K" and types["blk.0.attn_v.weight"] == "Q6_K"
    return path


@pytest.fixture(scope="module")
def q4_k_m(q4_k_m_path: Path) -> LoadedModel:
    """That GGUF loaded by our loader, with its blocks."""
    return load_model(str(q4_k_m_path), cache_dir=q4_k_m_path.parent / "cache")


@pytest.mark.model
@needs_kernel
def test_every_linear_of_a_q4_k_m_model_decodes_from_its_blocks(q4_k_m: LoadedModel,
                                                                 q4_k_m_path: Path) -> None:
    dense = load_model(str(q4_k_m_path), cache_dir=q4_k_m_path.parent / "cache",
                       gguf_blocks=False)  # fp32 weights the gguf package dequantized
    expected = {n: m.weight for n, m in dense.model.named_modules() if isinstance(m, Linear)}
    linears = {n: m for n, m in q4_k_m.model.named_modules() if isinstance(m, Linear)}
    kinds = {n: tuple(q.kind for q in m.quant_rows) for n, m in linears.items()}
    assert kinds["layers.1.self_attn.qkv_proj"] == ("Q4_K",)  # Q4_K q, k, v: one segment
    assert kinds["layers.0.self_attn.qkv_proj"] == ("Q4_K", "Q6_K")  # Q4_K q, k + Q6_K v
    assert kinds["layers.0.mlp.down_proj"] == ("Q6_K",) and kinds["lm_head"] == ("Q6_K",)
    assert kinds["layers.1.mlp.down_proj"] == kinds["layers.0.mlp.gate_up_proj"] == ("Q4_K",)
    for name, linear in linears.items():
        assert linear.quant_x16 is not None and len(linear.quant_x16) == len(kinds[name]), name
        assert linear.weight.device.type == "meta", name  # the blocks are the one copy
        # the blocks stand for exactly the weight gguf dequantizes
        weight = torch.cat([dequantize(q) for q in linear.quant_rows])
        assert torch.equal(weight.view(torch.int32), expected[name].view(torch.int32)), name
    x = torch.randn(3, 256)
    for name in ("layers.0.self_attn.qkv_proj", "layers.1.self_attn.qkv_proj"):
        torch.testing.assert_close(linears[name](x), x @ expected[name].t(), rtol=1e-3,
                                   atol=1e-3)


def _decode_steps(loaded: LoadedModel, decode_stack: bool) -> list[torch.Tensor]:
    """Two rows' logits over four decode steps after their prompts (the decode mirror on: the
    stack attends from it)."""
    mc = loaded.config
    pool = KVPool(capacity=256, num_layers=mc.num_layers, num_kv_heads=mc.num_kv_heads,
                  head_dim=mc.head_dim, dtype=torch.float32)
    table = ReqToTokenPool(max_reqs=2, max_context=128)
    runner = ModelRunner(loaded.model, pool, table,
                         TorchSDPABackend(pool, table, None, mirror_tokens=10_000,
                                          decode_stack=decode_stack))
    lens = [12, 20]
    for b in range(2):
        table.write(b, 0, pool.alloc(lens[b] + 8))
    runner.forward([BatchEntry(b, 0, list(range(100, 100 + lens[b])), seq_id=b)
                    for b in range(2)])
    return [runner.forward([BatchEntry(b, lens[b] + i, [7 + b + i], seq_id=b) for b in range(2)])
            for i in range(4)]


@pytest.mark.model
@needs_kernel
def test_the_decode_stack_runs_mixed_segments_like_the_layers(q4_k_m: LoadedModel) -> None:
    stack = q4_k_m.model.decode_stack
    assert stack is not None  # layers 0, 3, 6 and 7 have a Q4_K + Q6_K qkv
    calls: list[int] = []
    run = stack.run

    def counted(*args: Any) -> Any:
        calls.append(1)
        return run(*args)

    stack.run = counted  # type: ignore[method-assign]
    try:
        stacked = _decode_steps(q4_k_m, decode_stack=True)
    finally:
        del stack.run
    layered = _decode_steps(q4_k_m, decode_stack=False)
    assert len(calls) == 4
    for a, b in zip(stacked, layered, strict=True):
        assert (a - b).abs().max().item() < STACK_TOLERANCE


@pytest.mark.model
@needs_kernel
def test_a_type_without_a_kernel_is_named_at_load(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    path = model_shapes.make_gguf("smollm2-tiny", tmp_path, qtype="F16")
    with caplog.at_level(logging.INFO, logger="grammarserve.models.quant_weights"):
        loaded = load_model(str(path), cache_dir=tmp_path / "cache")
    assert not any(m.quant_rows for m in loaded.model.modules() if isinstance(m, Linear))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "no kernel for F16" in warned[0], warned


@pytest.mark.model
@needs_kernel
def test_the_kernels_a_model_runs_on_are_measured_at_load(q4_k_m: LoadedModel) -> None:
    report = q4_k_m.kernels
    assert report == q4_k_m.kernels and report.isa == cpu_isa() and report.levels == 2
    assert report.gemm_gops > 0 and report.isa_level == ISAS.index(report.isa) + 1
    assert f"{report.isa} build" in report.describe()
