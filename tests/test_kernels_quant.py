"""The AVX2 kernel over GGUF Q4_1 / Q8_0 (and repacked Q4_K) blocks: packing (Q6_K too) equals
gguf's dequantize, products equal the torch reference, the model's linears carry blocks equal to
their fp32 weights, and a machine that cannot build the kernel falls back with a reason."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from grammarserve_kernels import quant
from grammarserve_kernels.quant import (
    FP32_KERNEL_KINDS,
    PACKED_TYPES,
    QuantWeight,
    dequantize,
    pack_gguf_blocks,
    quant_kernel_available,
    quant_matmul,
    quant_matmul_ref,
)
from conftest import have_default_model
from quant_helpers import random_blocks

from grammarserve.engine.memory import model_bytes
from grammarserve.models.linear import QUANT_ROWS, Linear
from grammarserve.models.llama import LlamaModel
from grammarserve.models.loader import gguf_source, load_model
from grammarserve.models.quant_embedding import QuantEmbedding
from grammarserve.models.quant_weights import EMBEDDING, load_gguf_blocks

can_build = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") and bool(
    shutil.which("c++"))
needs_kernel = pytest.mark.skipif(not can_build, reason="needs an AVX2 CPU and a C++ compiler")


@pytest.mark.parametrize("kind,k", [("Q4_1", 96), ("Q8_0", 96), ("Q4_K", 512), ("Q6_K", 256),
                                    ("Q6_K", 4096)])
def test_pack_and_dequantize_equal_gguf(kind: str, k: int) -> None:
    raw = random_blocks(kind, 24, k)
    w = pack_gguf_blocks(kind, raw)
    ref = gguf_dequantize(raw, GGMLQuantizationType[kind]).astype(np.float32).reshape(24, k)
    assert w.shape == (24, k)
    # bit for bit (Q4_K's repacked scale and min, Q6_K's scale per 16: exact products in fp32)
    assert torch.equal(dequantize(w).view(torch.int32), torch.from_numpy(ref).view(torch.int32))


def test_q6_k_keeps_its_6_bit_values_and_scales() -> None:
    """The edge blocks of ``random_blocks`` (d = 0, scales -128 and 127, every value 0 or 63)
    come through as such, in natural element order."""
    raw = random_blocks("Q6_K", 3, 768)
    w = pack_gguf_blocks("Q6_K", raw)
    assert w.kind == "Q6_K" and w.qs.dtype == torch.uint8 and w.qs.shape == (3, 768)
    assert w.d.shape == (3, 3) and w.m.shape == (3, 48) and w.m.dtype == torch.int8
    assert w.shape == (3, 768) and w.d[0, 0] == 0  # d = 0
    assert not w.qs[0, 256:512].any() and bool((w.qs[0, 512:] == 63).all())
    d = float(np.frombuffer(raw[0, 3 * 210 - 2:3 * 210].tobytes(), np.float16)[0])
    assert w.d[0, 2].item() == d and w.m[0, 32:].tolist() == [-128, 127] * 8
    assert int(w.qs.max()) == 63 and w.nbytes() == 3 * 768 + 3 * 3 * 4 + 3 * 48


def test_the_fp32_kernel_refuses_kinds_it_lacks() -> None:
    assert "Q6_K" in PACKED_TYPES and "Q6_K" not in FP32_KERNEL_KINDS
    w = pack_gguf_blocks("Q6_K", random_blocks("Q6_K", 4, 256))
    with pytest.raises(ValueError, match="no Q6_K path"):
        quant_matmul(torch.randn(1, 256), w)


def test_pack_rejects_bad_blocks() -> None:
    with pytest.raises(ValueError, match="unsupported quant type 'Q2_K'"):
        pack_gguf_blocks("Q2_K", np.zeros((2, 20), np.uint8))
    with pytest.raises(ValueError, match=r"uint8 \[N, nb\*20\]"):
        pack_gguf_blocks("Q4_1", np.zeros((2, 21), np.uint8))
    with pytest.raises(ValueError, match=r"uint8 \[N, nb\*144\]"):
        pack_gguf_blocks("Q4_K", np.zeros((2, 145), np.uint8))
    with pytest.raises(ValueError, match=r"uint8 \[N, nb\*210\]"):
        pack_gguf_blocks("Q6_K", np.zeros((2, 211), np.uint8))


@needs_kernel
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "Q4_K"])
@pytest.mark.parametrize("k", [32, 576, 1536])  # 1536: the 4-row tiles (8 rows exceed L1)
def test_kernel_matches_reference(kind: str, k: int) -> None:
    if kind == "Q4_K":
        k = -(-k // 256) * 256  # whole super-blocks
    w = pack_gguf_blocks(kind, random_blocks(kind, 72, k, seed=k))
    gen = torch.Generator().manual_seed(k)
    for rows in [1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17]:
        x = torch.randn(rows, k, generator=gen)
        got, ref = quant_matmul(x, w), quant_matmul_ref(x, w)
        assert got.shape == (rows, 72) and got.is_contiguous()
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5 * k ** 0.5)


@needs_kernel
def test_kernel_rejects_wrong_inputs() -> None:
    w = pack_gguf_blocks("Q8_0", random_blocks("Q8_0", 8, 64))
    with pytest.raises(ValueError, match=r"fp32 \[R, 64\]"):
        quant_matmul(torch.randn(2, 32), w)
    with pytest.raises(ValueError, match=r"fp32 \[R, 64\]"):
        quant_matmul(torch.randn(2, 64, dtype=torch.float64), w)


@needs_kernel
def test_linear_uses_blocks_only_for_skinny_batches() -> None:
    w = pack_gguf_blocks("Q4_1", random_blocks("Q4_1", 40, 64))
    lin = Linear(64, 40, bias=True)
    with torch.no_grad():
        lin.weight.copy_(dequantize(w))
    lin.quant = w
    for rows in (1, QUANT_ROWS, QUANT_ROWS + 1, 40):
        x = torch.randn(rows, 64)
        ref = x @ lin.weight.t() + lin.bias
        torch.testing.assert_close(lin(x).contiguous(), ref, rtol=1e-5, atol=1e-4)


def test_no_compiler_falls_back_with_a_reason(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    monkeypatch.setattr(quant, "_SOURCE", tmp_path / "quant_cpu.cpp")
    (tmp_path / "quant_cpu.cpp").write_text("this is not C++\n")
    monkeypatch.setenv("GRAMMARSERVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", "c++" if shutil.which("c++") else "/nonexistent/c++")
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("no AVX2: the kernel is refused before any build")
    assert not quant_kernel_available()
    assert "cannot build quant_cpu.cpp" in (quant.quant_kernel_error() or "")
    with pytest.raises(RuntimeError, match="quantized CPU kernel is unavailable"):
        quant_matmul(torch.randn(1, 32), QuantWeight("Q8_0", torch.zeros(1, 32, dtype=torch.int8),
                                                     torch.ones(1, 1), torch.empty(0)))


@pytest.fixture(scope="module")
def smollm_dense():  # type: ignore[no-untyped-def]
    """The embedded model loaded without blocks: fp32 weights the gguf package dequantized."""
    if not have_default_model():
        pytest.skip("embedded model not installed")
    return load_model("default", dtype=torch.float32, device="cpu", gguf_blocks=False)


def _dense_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: m.dense() for n, m in model.named_modules() if isinstance(m, Linear)}


@pytest.mark.model
@needs_kernel
def test_the_blocks_are_the_one_copy_of_the_quantized_weights(smollm, smollm_dense) -> None:  # type: ignore[no-untyped-def]
    linears = [m for m in smollm.model.modules() if isinstance(m, Linear)]
    assert len(linears) == 4 * smollm.config.num_layers + 1
    assert all(m.quant_x16 and not m._rows for m in linears)  # one layout: the kernel's
    assert all(m.weight.device.type == "meta" for m in linears)  # no fp32 copy was loaded
    assert isinstance(smollm.model.embed_tokens, QuantEmbedding)
    dense = _dense_weights(smollm_dense.model)
    for name, weight in _dense_weights(smollm.model).items():
        assert torch.equal(weight, dense[name]), name
    ids = torch.tensor([[0, 5, 49151], [17, 17, 300]])
    assert torch.equal(smollm.model.embed_tokens(ids), smollm_dense.model.embed_tokens(ids))
    assert model_bytes(smollm.model) * 3 < model_bytes(smollm_dense.model)


@pytest.mark.model
@needs_kernel
def test_packed_blocks_cache_round_trips_and_recovers(smollm, smollm_dense,  # type: ignore[no-untyped-def]
                                                      tmp_path: Path) -> None:
    source = gguf_source("default")
    assert source is not None
    expected = _dense_weights(smollm_dense.model)
    with torch.device("meta"):
        shell = LlamaModel(smollm.config)
    for _ in range(2):  # the first call parses the GGUF and writes the cache, the second reads it
        blocks = load_gguf_blocks(shell, source, cache=tmp_path)
        assert blocks is not None
        assert set(blocks.packed) == {*expected, EMBEDDING}
        cached = list((tmp_path / "blocks").glob("*.safetensors"))
        assert len(cached) == 1
        for name, rows in blocks.packed.items():
            if name != EMBEDDING:
                assert torch.equal(torch.cat([dequantize(q) for q in rows]), expected[name]), name
    cached[0].write_bytes(b"not a safetensors file")
    blocks = load_gguf_blocks(shell, source, cache=tmp_path)
    assert blocks is not None and len(blocks.packed) == len(expected) + 1
    assert cached[0].stat().st_size > 100_000_000  # rebuilt from the GGUF and rewritten
