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


def test_a_planned_pool_too_small_to_serve_is_refused(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A full machine: the engine refuses to start before loading, in one line naming the
    weights, the memory available and what was needed, instead of serving from a pool of a
    token or two (every request would then fail as too long)."""
    build_tiny("llama", {}, tmp_path / "m", tiny_tokenizer())
    monkeypatch.setattr(memory_module, "available_memory_bytes", lambda device: 2**20)
    with pytest.raises(OutOfMemoryError, match=r"^the model does not fit in cpu memory: "
                       r"weights \d+ MiB, 1 MiB available, \d+ MiB needed") as e:
        Engine(EngineConfig(model=str(tmp_path / "m"), device="cpu"))
    assert "\n" not in str(e.value)


def test_the_engine_builds_and_reports_its_plan(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's pool, mirror and host tier are what the engine builds, and its stats carry
    them; a machine with room for the weights and little else still starts (a small pool)."""
    build_tiny("llama", {}, tmp_path / "m", tiny_tokenizer())
    engine = Engine(EngineConfig(model=str(tmp_path / "m"), device="cpu"))
    plan = engine.memory_plan
    assert engine.runner.pool.capacity == plan.kv_tokens >= 8192
    assert engine.runner.attn.mirror is not None
    assert engine.runner.attn.mirror.max_tokens == plan.mirror_tokens > 0
    assert engine.tiers is not None and engine.tiers.stats().host_bytes == 0  # none held yet
    stats = engine.stats()
    assert (stats.kv_pool_bytes, stats.kv_mirror_tokens, stats.kv_host_tier_limit_bytes) == (
        plan.kv_bytes, plan.mirror_tokens, plan.host_tier_bytes)
    assert stats.memory_weights_bytes == plan.weights_bytes > 0
    tight = plan.activation_bytes + 600 * plan.bytes_per_token
    monkeypatch.setattr(memory_module, "available_memory_bytes", lambda device: tight)
    small = Engine(EngineConfig(model=str(tmp_path / "m"), device="cpu"), loaded=engine.loaded)
    assert small.memory_plan.kv_tokens == 512 and small.memory_plan.mirror_tokens == 0


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
