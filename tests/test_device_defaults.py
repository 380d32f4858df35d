"""Device defaults decided on CPU: config resolution for CUDA and CPU, the memory plan, and the
loader's dtype (no CUDA needed: these are the decisions, not the kernels)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import build_tiny, tiny_tokenizer

import grammarserve.engine.memory as memory_module
from grammarserve.config import EngineConfig
from grammarserve.engine.engine import Engine
from grammarserve.engine.memory import (
    ActivationShape,
    activation_reserve_bytes,
    mirror_tokens_for,
    plan_kv_tokens,
)
from grammarserve.errors import InvalidRequestError, OutOfMemoryError
from grammarserve.models.loader import load_model


def test_cuda_gets_bf16_varlen_and_no_cpu_paths() -> None:
    c = EngineConfig(device="cuda:1").resolved()
    assert (c.device, c.dtype, c.torch_kv_dtype) == ("cuda:1", "bfloat16", torch.bfloat16)
    assert c.attention_backend == "varlen" and c.kv_memory_fraction == 0.85
    assert c.decode_mirror_tokens == 0
    assert not (c.gguf_blocks or c.decode_attention_kernel or c.decode_stack_kernel)
    assert c.tf32


def test_auto_device_follows_cuda_availability() -> None:
    assert EngineConfig().resolved(cuda_available=True).device == "cuda"
    c = EngineConfig().resolved(cuda_available=False)
    assert (c.device, c.dtype, c.attention_backend, c.kv_memory_fraction) == (
        "cpu", "float32", "torch", 0.25)
    assert c.decode_mirror_tokens is None and c.gguf_blocks and c.decode_stack_kernel


def test_named_choices_survive_resolution() -> None:
    c = EngineConfig(device="cuda", dtype="float32", kv_dtype="bfloat16",
                     attention_backend="torch", kv_memory_fraction=0.5).resolved()
    assert (c.dtype, c.torch_kv_dtype, c.attention_backend, c.kv_memory_fraction) == (
        "float32", torch.bfloat16, "torch", 0.5)
    assert EngineConfig(device="cpu", dtype="bfloat16").resolved().torch_dtype == torch.bfloat16
    resolved = EngineConfig(device="cpu").resolved()
    assert resolved.resolved() == resolved


@pytest.mark.parametrize(("field", "value"), [("device", "cuda1"), ("device", "gpu"),
                                              ("attention_backend", "flash"),
                                              ("kv_memory_fraction", 0.0)])
def test_bad_device_settings_are_refused(field: str, value: object) -> None:
    with pytest.raises(InvalidRequestError) as e:
        EngineConfig(**{field: value})  # type: ignore[arg-type]
    assert e.value.param == field


def test_kv_plan_counts_mirror_gather_and_reserve() -> None:
    mib = 2**20
    # 1000 MiB free, half of it, 1 MiB per token: 500 tokens with nothing else to count
    assert plan_kv_tokens(1000 * mib, 0.5, mib) == 500
    # a 100 MiB reserve comes off before the fraction
    assert plan_kv_tokens(1000 * mib, 0.5, mib, reserve=100 * mib) == 450
    # a gathered layer (1 of 4) costs a quarter of the pool on top
    assert plan_kv_tokens(1000 * mib, 0.5, mib, gather_layers=4) == 400
    # an explicit mirror of 100 tokens
    assert plan_kv_tokens(1000 * mib, 0.5, mib, mirror=100) == 400
    # the default mirror: capacity / 2 when that is over its 32768-token floor ...
    big = plan_kv_tokens(3 * 65536 * 1000, 1.0, 1000, mirror=None)
    assert big == 131072 and mirror_tokens_for(big, None) == 65536
    # ... else the floor, which comes off first
    assert plan_kv_tokens(60000 * 1000, 1.0, 1000, mirror=None) == 60000 - 32768


def test_a_planned_pool_too_small_to_serve_is_refused(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A full machine: the engine refuses to start, naming the settings, instead of serving
    from a pool of a token or two (every request would then fail as too long)."""
    build_tiny("llama", {}, tmp_path / "m", tiny_tokenizer())
    monkeypatch.setattr(memory_module, "available_memory_bytes", lambda device: 2**20)
    with pytest.raises(OutOfMemoryError, match="kv_memory_fraction.*kv_cache_tokens"):
        Engine(EngineConfig(model=str(tmp_path / "m"), device="cpu"))
    assert plan_kv_tokens(2**20, 0.5, 2**20) == 0  # no room: none, not one


def test_activation_reserve_covers_a_full_forward() -> None:
    # Llama-3.1-8B shape, 2048-token forward, 64 rows of logits, bf16
    a = ActivationShape(2048, 64, 4096, 14336, 4096, 1024, 128256, 2)
    per_token = (3 * 4096 + 2 * (4096 + 2048) + 4096 + 3 * 14336) * 2
    assert activation_reserve_bytes(a) == 2 * (2048 * per_token + 64 * 128256 * 14)
    assert 0.5e9 < activation_reserve_bytes(a) < 1e9


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_loader_reads_straight_into_dtype(dtype: torch.dtype, tmp_path: Path) -> None:
    build_tiny("llama", {}, tmp_path / "m", tiny_tokenizer())
    ref = load_model(str(tmp_path / "m"))
    lm = load_model(str(tmp_path / "m"), dtype=dtype)
    assert {p.dtype for p in lm.model.parameters()} == {dtype}
    assert lm.model.inv_freq.dtype == torch.float32
    for (name, p), q in zip(ref.model.named_parameters(), lm.model.parameters()):
        assert torch.equal(p.to(dtype), q), name
