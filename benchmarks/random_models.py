"""Randomly initialised models of real shapes, for the GPU smoke test (benchmarks/gpu_smoke.py).

No weights travel to the GPU machine, so the smoke test builds them there: the embedded model's
exact config (SmolLM2-135M, from its GGUF metadata) written as a Hugging Face folder with seeded
random weights and the real tokenizer, and the Llama-3.2-1B and Llama-3.1-8B shapes built
straight on the device. Random weights with Hugging Face's init (std 0.02) give near-flat
logits, where greedy comparisons would only compare noise; these are scaled so that the logits
have clear margins (embedding std 0.5, projections 1/sqrt(fan-in), norm gains 1 +- 0.1): the
smoke test reports the share of positions whose top-2 margin is still below fp32 noise.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from grammarserve.attention.backend import AttentionBackend, TorchSDPABackend
from grammarserve.attention.kv_pool import KVPool, ReqToTokenPool
from grammarserve.attention.varlen import VarlenBackend
from grammarserve.engine.cuda_graphs import DecodeGraphs
from grammarserve.engine.model_runner import BatchEntry, ModelRunner
from grammarserve.engine.sampler import sample
from grammarserve.models.config import ModelConfig
from grammarserve.models.llama import LlamaModel
from grammarserve.models.rope import rope_inv_freq
from grammarserve.sampling_params import SamplingParams

EMBED_STD = 0.5
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")

_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
# Hugging Face config.json fields of the two public shapes (meta-llama's configs).
SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.2-1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                     "vocab_size": 128256, "tie_word_embeddings": True},
    "llama-3.1-8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                     "vocab_size": 128256, "tie_word_embeddings": False},
    # the --small dry run's stand-in for both
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "vocab_size": 512, "tie_word_embeddings": False},
}


def llama_config(shape: str) -> dict[str, Any]:
    """A full ``config.json`` dict for one of :data:`SHAPES`."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0, "rope_scaling": dict(_LLAMA3_ROPE),
            "max_position_embeddings": 131072, "bos_token_id": 1, "eos_token_id": 2,
            **SHAPES[shape]}


def _std(name: str, shape: tuple[int, ...]) -> float:
    return EMBED_STD if "embed" in name or "lm_head" in name else shape[-1] ** -0.5


def hf_random_state(cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """Seeded fp32 weights under Hugging Face names (CPU)."""
    g = torch.Generator().manual_seed(seed)
    h, d = cfg.hidden_size, cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h),
                                          "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (cfg.num_heads * d, h),
                       p + "self_attn.k_proj.weight": (cfg.num_kv_heads * d, h),
                       p + "self_attn.v_proj.weight": (cfg.num_kv_heads * d, h),
                       p + "self_attn.o_proj.weight": (h, cfg.num_heads * d),
                       p + "mlp.gate_proj.weight": (cfg.intermediate_size, h),
                       p + "mlp.up_proj.weight": (cfg.intermediate_size, h),
                       p + "mlp.down_proj.weight": (h, cfg.intermediate_size),
                       p + "input_layernorm.weight": (h,),
                       p + "post_attention_layernorm.weight": (h,)})
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            out[name] = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            out[name] = torch.randn(shape, generator=g) * _std(name, shape)
    return out


def write_random_folder(folder: Path, config_json: dict[str, Any], tokenizer_dir: Path | None,
                        *, seed: int = 0) -> Path:
    """A loadable Hugging Face folder: ``config_json``, seeded random weights (fp32
    safetensors) and, from ``tokenizer_dir``, the tokenizer files."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config_json, indent=1))
    cfg = ModelConfig.from_hf_dict(config_json)
    save_file(hf_random_state(cfg, seed), str(folder / "model.safetensors"))
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            if (tokenizer_dir / name).is_file():
                shutil.copy(tokenizer_dir / name, folder / name)
    return folder


@torch.no_grad()
def random_model_on(cfg: ModelConfig, dtype: torch.dtype, device: torch.device,
                    seed: int = 0) -> LlamaModel:
    """A :class:`LlamaModel` whose weights are drawn on ``device`` in ``dtype`` directly (an 8B
    model never exists in fp32 or on the host)."""
    with torch.device("meta"):
        model = LlamaModel(cfg)
    g = torch.Generator(device=device).manual_seed(seed)
    for mod_name, mod in list(model.named_modules()):
        for name, p in list(mod.named_parameters(recurse=False)):
            t = torch.empty(p.shape, dtype=dtype, device=device)
            if p.dim() == 1:
                t.normal_(1.0, 0.1, generator=g)
            else:
                t.normal_(0.0, _std(f"{mod_name}.{name}", tuple(p.shape)), generator=g)
            setattr(mod, name, nn.Parameter(t, requires_grad=False))
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling).to(device)
    return model.eval()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode_bench(model: LlamaModel, device: torch.device, batch: int, *, prompt_len: int = 128,
                 steps: int = 16, warmup: int = 3, backend: str = "varlen",
                 graphs: bool = False) -> dict[str, Any]:
    """Prefill ``batch`` random prompts, then time greedy decode steps as the engine runs them
    (a KV slot allocated and recorded per request, one forward, the fused sampler, one read
    back of the tokens); with ``graphs``, decode steps replay CUDA graphs (captured in the
    warm-up). Returns ms per step, tokens/s and the peak device memory."""
    cfg = model.config
    dtype = model.embed_tokens.weight.dtype
    total = prompt_len + warmup + steps + 1
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    pool = KVPool(capacity=batch * total + 8, num_layers=cfg.num_layers,
                  num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, dtype=dtype,
                  device=device)
    table = ReqToTokenPool(max_reqs=batch, max_context=total + 1, device=device)
    attn: AttentionBackend = (VarlenBackend(pool, table) if backend == "varlen"
                              else TorchSDPABackend(pool, table, mirror_tokens=0))
    runner = ModelRunner(model, pool, table, attn,
                         DecodeGraphs(model, pool, table, batch) if graphs else None)
    g = torch.Generator().manual_seed(batch)
    prompts = torch.randint(0, cfg.vocab_size, (batch, prompt_len), generator=g).tolist()
    rows = [table.alloc() for _ in range(batch)]
    greedy = [SamplingParams(max_tokens=1, temperature=0)] * batch
    per_chunk = max(1, 8192 // prompt_len)
    last: list[int] = []
    for start in range(0, batch, per_chunk):
        chunk = list(range(start, min(batch, start + per_chunk)))
        for i in chunk:
            table.write(rows[i], 0, pool.alloc(prompt_len))
        logits = runner.forward([BatchEntry(rows[i], 0, prompts[i], i) for i in chunk])
        last += sample(logits, greedy[:len(chunk)], [None] * len(chunk)).token_ids
    pos = prompt_len
    times = []
    for step in range(warmup + steps):
        _sync(device)
        t0 = time.perf_counter()
        for row in rows:
            table.write(row, pos, pool.alloc(1))
        logits = runner.forward([BatchEntry(rows[i], pos, [last[i]], i) for i in range(batch)])
        last = sample(logits, greedy, [None] * batch).token_ids  # reads the tokens back
        if step >= warmup:
            times.append(time.perf_counter() - t0)
        pos += 1
    times.sort()
    ms = 1000 * times[len(times) // 2]
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    failed = runner.graphs.failed if runner.graphs is not None else None
    return {"batch": batch, "graphs": graphs if failed is None else f"failed: {failed}"[:300],
            "ms_per_step": round(ms, 3), "tokens_per_s": round(batch * 1000 / ms, 1),
            "ms_min": round(1000 * times[0], 3), "peak_mem_gib": round(peak / 2**30, 2),
            "context": prompt_len + warmup + steps // 2}
