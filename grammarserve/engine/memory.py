"""Memory facts of this machine and model, and the engine's plan from them
(:mod:`grammarserve.engine.memory_plan` shares the memory out)."""

from __future__ import annotations

import dataclasses
import itertools
import os
import resource
from dataclasses import dataclass

import torch
from grammarserve_kernels.quant import LAYOUT_BYTES_PER_WEIGHT

from grammarserve.config import EngineConfig
from grammarserve.engine.kv_tiers.blocks import DEFAULT_BLOCK_TOKENS
from grammarserve.engine.memory_plan import (
    MIN_PLANNED_KV_TOKENS,
    MemoryPlan,
    PlanInputs,
    plan_memory,
    weights_fit_error,
)
from grammarserve.errors import OutOfMemoryError
from grammarserve.models.config import ModelConfig
from grammarserve.models.gguf_convert import GGUFWeights
from grammarserve.models.loader import gguf_source, resolve_model_folder


def available_memory_bytes(device: torch.device) -> int:
    """Free device memory (CUDA) or the host's MemAvailable (CPU)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    found = _proc_kib("/proc/meminfo", "MemAvailable:")
    if found is not None:
        return found
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def process_rss_bytes() -> int:
    """Resident set size of this process now (falls back to the peak)."""
    found = _proc_kib("/proc/self/status", "VmRSS:")
    if found is not None:
        return found
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


@dataclass(frozen=True)
class ActivationShape:
    """What one forward's transient tensors scale with (see :func:`activation_reserve_bytes`)."""

    max_batch_tokens: int
    max_rows: int  # requests per forward: rows of logits
    hidden: int
    intermediate: int
    q_width: int  # heads * head_dim
    kv_width: int  # kv_heads * head_dim
    vocab: int
    elem: int  # bytes per activation element


def activation_reserve_bytes(a: ActivationShape) -> int:
    """Memory to keep free for one forward of ``max_batch_tokens`` tokens: the largest layer's
    transients (residual, norm, fused QKV and its rotated copy, attention output, gate/up and
    their product) and the fp32 logits with the sampler's working copies, times two for the
    allocator's rounding and fragmentation."""
    per_token = (3 * a.hidden + 2 * (a.q_width + 2 * a.kv_width) + a.q_width
                 + 3 * a.intermediate) * a.elem
    logits = a.max_rows * a.vocab * (a.elem + 3 * 4)
    return 2 * (a.max_batch_tokens * per_token + logits)


def estimate_weight_bytes(mc: ModelConfig, itemsize: int) -> int:
    """The weights' bytes in a dtype of ``itemsize`` bytes, from the model's shape alone (before
    loading; a lower bound where the loader also keeps quantized blocks)."""
    q, kv = mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim
    layer = mc.hidden_size * (2 * q + 2 * kv) + 3 * mc.hidden_size * mc.intermediate_size \
        + 2 * mc.hidden_size
    embed = mc.vocab_size * mc.hidden_size * (1 if mc.tie_word_embeddings else 2)
    return (mc.num_layers * layer + embed + mc.hidden_size) * itemsize


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of ``model``'s tensors: parameters, buffers and the tensors of the modules'
    dataclass attributes (the GGUF blocks the CPU kernels read), each storage once."""
    seen: dict[int, int] = {}

    def add(t: torch.Tensor) -> None:
        if t.device.type != "meta":
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    for t in itertools.chain(model.parameters(), model.buffers()):
        add(t)
    for m in model.modules():
        for value in vars(m).values():
            for item in value if isinstance(value, tuple) else (value,):
                if dataclasses.is_dataclass(item) and not isinstance(item, type):
                    for f in dataclasses.fields(item):
                        if isinstance(t := getattr(item, f.name), torch.Tensor):
                            add(t)
    return sum(seen.values())


def gguf_weight_bytes(mc: ModelConfig, left: dict[str, tuple[str, int]]) -> int:
    """The weights' bytes on CPU in fp32 where the GGUF blocks are the one copy: ``left`` (HF
    name -> (GGUF type, elements), the weights a converted folder left in its GGUF) in their
    kernel layouts (fp32 for types without one; a tied embedding twice: the lookup's rows and
    the LM head's x16 layout), the rest fp32."""
    dense = estimate_weight_bytes(mc, 4) - 4 * sum(n for _, n in left.values())
    blocks = sum(LAYOUT_BYTES_PER_WEIGHT.get(kind, 4.0) * n for kind, n in left.values())
    embed = left.get("model.embed_tokens.weight")
    if mc.tie_word_embeddings and embed is not None:
        blocks += LAYOUT_BYTES_PER_WEIGHT.get(embed[0], 0.0) * embed[1]
    return dense + int(blocks)


def activation_bytes(c: EngineConfig, mc: ModelConfig) -> int:
    """:func:`activation_reserve_bytes` for ``c``'s forward on ``mc``."""
    return activation_reserve_bytes(ActivationShape(
        c.max_batch_tokens, c.max_num_reqs, mc.hidden_size, mc.intermediate_size,
        mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim, mc.vocab_size,
        c.torch_dtype.itemsize))


def kv_token_bytes(mc: ModelConfig, dtype: torch.dtype) -> int:
    """One token's K and V over all layers in ``dtype``."""
    return 2 * mc.num_layers * mc.num_kv_heads * mc.head_dim * dtype.itemsize


def check_weights_fit(c: EngineConfig) -> None:
    """Raise :func:`weights_fit_refusal`'s error, if any, for the memory available now (before
    loading)."""
    error = weights_fit_refusal(c, available_memory_bytes(c.torch_device))
    if error is not None:
        raise error


def weights_fit_refusal(c: EngineConfig, available: int) -> OutOfMemoryError | None:
    """The :class:`OutOfMemoryError` where ``c.model``'s weights in ``c``'s dtype (with the GGUF
    blocks the CPU kernels keep), one forward's activations and a minimal KV pool exceed
    ``available`` bytes; None where they fit."""
    folder = resolve_model_folder(c.model, c.cache_dir)
    mc = ModelConfig.from_folder(folder)
    source = gguf_source(c.model)
    weights = estimate_weight_bytes(mc, c.torch_dtype.itemsize)
    if c.gguf_blocks and source is not None and c.torch_device.type == "cpu" \
            and c.torch_dtype == torch.float32:
        weights = gguf_weight_bytes(mc, GGUFWeights(folder, source).types())
    return weights_fit_error(
        c.torch_device.type, weights,
        available, activation_bytes(c, mc),
        MIN_PLANNED_KV_TOKENS * kv_token_bytes(mc, c.torch_kv_dtype))


def plan_engine_memory(c: EngineConfig, mc: ModelConfig, weights: int, *,
                       varlen: bool) -> MemoryPlan:
    """The :class:`MemoryPlan` of resolved config ``c`` for ``mc``, from the memory available
    now (after ``weights`` bytes of weights were loaded)."""
    assert c.kv_memory_fraction is not None  # resolved
    device = c.torch_device
    available = available_memory_bytes(device)
    host = available if device.type == "cpu" else available_memory_bytes(torch.device("cpu"))
    tier_dtype = c.torch_tier_dtype or c.torch_kv_dtype
    return plan_memory(PlanInputs(
        device.type, available, host, weights, activation_bytes(c, mc), c.kv_memory_fraction,
        kv_token_bytes(mc, c.torch_kv_dtype), kv_token_bytes(mc, tier_dtype),
        gather_layers=mc.num_layers if varlen else 0, kv_tokens=c.kv_cache_tokens,
        mirror_tokens=0 if varlen else c.decode_mirror_tokens,
        host_tier_bytes=c.kv_host_tier_bytes, prefix_cache=c.enable_prefix_cache,
        tier_block_tokens=DEFAULT_BLOCK_TOKENS))


def _proc_kib(path: str, key: str) -> int | None:
    """Bytes of a ``key: N kB`` line of a /proc file, or None where there is none."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None

