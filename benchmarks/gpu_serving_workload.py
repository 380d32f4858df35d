"""The workload and the rooflines of benchmarks/bench_gpu_serving.py (pure functions, no engine).

- **Requests**: ``n`` prompts of random token ids whose lengths are drawn log-uniformly in
  ``[lo, hi]`` (seeded, so every run and every constrained fraction sees the same prompts),
  a share ``fraction`` of them under a ``json_schema`` constraint from ``schemas/`` (spread
  evenly: request ``i`` is constrained when ``floor((i + 1) * f) > floor(i * f)``), greedy.
  Unconstrained ones generate ``max_tokens`` tokens (``ignore_eos``); constrained ones stop
  where their grammar ends (at most ``constrained_max_tokens``).
- **Memory roofline of a decode step**: the bytes one step must read from HBM (every weight a
  decode step multiplies by, the LM head included, but not the embedding table of an untied
  model, of which it reads one row per request; plus each running request's whole KV) over the
  GPU's peak bandwidth.
- **Compute roofline of prefill**: peak dense bf16 FLOP/s over ``2 * P`` FLOPs per prompt
  token, ``P`` the parameters of the decoder layers (the LM head runs on one row per request,
  the embedding is a lookup; attention's own FLOPs are left out, so the bound is optimistic
  for long prompts).

Peak figures come from :data:`GPU_PEAKS` by device name, or from the command line (which is
how a CPU run gets any: without them its rooflines are null).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grammarserve.constraints import Constraint
from grammarserve.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
#: Schemas with short, bounded replies (enums, booleans, bounded numbers, bounded arrays).
SCHEMAS = ("content_moderation", "ticket_triage", "sentiment_analysis", "apparel_order")


@dataclass(frozen=True)
class GpuPeak:
    """Datasheet peaks of one GPU: HBM bandwidth and dense bf16 tensor throughput."""

    bandwidth_bytes_s: float
    bf16_flops: float


#: By a substring of ``torch.cuda.get_device_properties().name``, most specific first.
GPU_PEAKS: tuple[tuple[str, GpuPeak], ...] = (
    ("H200", GpuPeak(4.8e12, 989e12)),
    ("H100 PCIe", GpuPeak(2.0e12, 756e12)),
    ("H100", GpuPeak(3.35e12, 989e12)),
    ("A100-SXM4-80GB", GpuPeak(2.039e12, 312e12)),
    ("A100", GpuPeak(1.555e12, 312e12)),
    ("L40S", GpuPeak(0.864e12, 362e12)),
)


def gpu_peak(name: str | None, bandwidth_gbs: float | None = None,
             tflops: float | None = None) -> GpuPeak | None:
    """The peaks of the GPU called ``name`` (None for an unknown GPU or a CPU), each replaced
    by the command line's figure when given (both given: used whatever the device)."""
    known = next((p for key, p in GPU_PEAKS if name and key in name), None)
    bw = bandwidth_gbs * 1e9 if bandwidth_gbs else known.bandwidth_bytes_s if known else None
    fl = tflops * 1e12 if tflops else known.bf16_flops if known else None
    return GpuPeak(bw, fl) if bw and fl else None


@dataclass(frozen=True)
class ModelBytes:
    """What the rooflines need of a model: decode-read weight bytes and layer parameters."""

    decode_weight_bytes: int
    layer_params: int
    kv_bytes_per_token: int


def model_bytes(model: torch.nn.Module, kv_bytes_per_token: int) -> ModelBytes:
    """:class:`ModelBytes` of a ``LlamaModel`` (tied weights counted once)."""
    seen: set[int] = set()
    total = layers = 0
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel() * p.element_size()
        if name.startswith("layers."):
            layers += p.numel()
    embed = model.get_parameter("embed_tokens.weight")
    head = model.get_parameter("lm_head.weight")
    untied_embed = 0 if embed is head else embed.numel() * embed.element_size()
    return ModelBytes(total - untied_embed, layers, kv_bytes_per_token)


def decode_roofline_ms(mb: ModelBytes, context_tokens: float, peak: GpuPeak | None
                       ) -> float | None:
    """The fastest a decode step over ``context_tokens`` of KV (all requests) can be."""
    if peak is None:
        return None
    return 1000 * (mb.decode_weight_bytes + context_tokens * mb.kv_bytes_per_token) \
        / peak.bandwidth_bytes_s


def prefill_roofline_tokens_s(mb: ModelBytes, peak: GpuPeak | None) -> float | None:
    """The most prompt tokens per second the tensor cores allow (``2 * layer params``)."""
    return None if peak is None else peak.bf16_flops / (2 * mb.layer_params)


def load_schema(name: str) -> dict[str, Any]:
    """The JSON Schema of ``schemas/<name>.json``."""
    schema: dict[str, Any] = json.loads((ROOT / "schemas" / f"{name}.json").read_text())["schema"]
    return schema


@dataclass(frozen=True)
class RequestSpec:
    """One request of the workload: its id, prompt, parameters and schema (None: free)."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    schema_name: str | None


@dataclass(frozen=True)
class WorkloadShape:
    """How a point's requests are drawn (see the module docstring)."""

    prompt_lo: int
    prompt_hi: int
    max_tokens: int
    constrained_max_tokens: int
    token_lo: int  # prompt token ids are drawn in [token_lo, token_hi)
    token_hi: int
    seed: int = 0


def prompt_lengths(n: int, lo: int, hi: int, seed: int) -> list[int]:
    """``n`` lengths, log-uniform in ``[lo, hi]``, the same for the same arguments."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g, dtype=torch.float64).tolist()
    return [min(hi, round(math.exp(math.log(lo) + x * (math.log(hi) - math.log(lo)))))
            for x in u]


def is_constrained(i: int, fraction: float) -> bool:
    """Whether request ``i`` is constrained, spreading a share ``fraction`` evenly."""
    return math.floor((i + 1) * fraction + 1e-9) > math.floor(i * fraction + 1e-9)


def requests(n: int, fraction: float, shape: WorkloadShape, tag: str) -> list[RequestSpec]:
    """The ``n`` requests of one point (ids prefixed with ``tag``)."""
    lengths = prompt_lengths(n, shape.prompt_lo, shape.prompt_hi, shape.seed)
    g = torch.Generator().manual_seed(shape.seed + 1)
    constraints = {name: Constraint.json_schema(load_schema(name)) for name in SCHEMAS}
    out = []
    for i, length in enumerate(lengths):
        ids = torch.randint(shape.token_lo, shape.token_hi, (length,), generator=g).tolist()
        if is_constrained(i, fraction):
            name = SCHEMAS[i % len(SCHEMAS)]
            params = SamplingParams(max_tokens=shape.constrained_max_tokens, temperature=0,
                                    constraint=constraints[name])
        else:
            name = None
            params = SamplingParams(max_tokens=shape.max_tokens, temperature=0,
                                    ignore_eos=True)
        out.append(RequestSpec(f"{tag}-{i}", ids, params, name))
    return out


def percentiles(xs: list[float]) -> dict[str, float | None]:
    """``{"p50": ..., "p99": ...}`` (nearest rank; None for no samples), in the unit given."""
    if not xs:
        return {"p50": None, "p99": None}
    s = sorted(xs)

    def rank(q: float) -> float:
        return round(s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))], 3)

    return {"p50": rank(0.50), "p99": rank(0.99)}
