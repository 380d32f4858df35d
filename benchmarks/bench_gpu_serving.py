"""GPU serving benchmark (issue 38): the whole engine under a mixed workload; prints ONE JSON line.

For each model shape (randomly initialised Llama-3.2-1B and Llama-3.1-8B, built on the device in
bf16, with the embedded model's real SmolLM2 tokenizer; benchmarks/random_models.py), each
constrained fraction (0, 0.5, 1.0 by default) and each batch (1, 8, 32, 128, 256), the real
:class:`~grammarserve.engine.engine.Engine` (scheduler, grammar runner, sampler) serves waves of
``batch`` requests submitted together (benchmarks/gpu_serving_workload.py: mixed prompt lengths,
json_schema constraints from schemas/). The prefix cache is off (every prompt is new, and the
points reuse prompts), speculative decoding is off unless ``--spec`` (decode steps are then one
token per request) and the adaptive batch cap is off (so ``batch`` requests run together); JSON is in the compact
style (``--json-style``: random weights would fill the flexible style's whitespace runs).

Each point reports:

- ``decode``: steady decode steps (every request of the wave running, none prefilling; the first
  two of each wave left out) as ms/step (median) against the memory roofline of the same steps
  (``x_roofline``; null without peak figures), and the sampled tokens/s;
- ``prefill``: prompt tokens over the time of the steps that computed prompt tokens (decode rows
  ride along in them) against the compute roofline;
- ``requests_per_s``, ``output_tokens_per_s``, TTFT (submission to first token) and ITL (between
  successive outputs that carried tokens) p50/p99 in ms;
- ``syncs`` (CUDA only): host synchronisations inside a few steady decode steps under
  ``torch.cuda.set_sync_debug_mode("warn")`` (benchmarks/sync_count.py), by repository line.

and per shape ``ratios``: by batch and fraction, constrained over unconstrained steady-decode
tokens/s (``decode``) and output tokens/s (``output``).

    python benchmarks/bench_gpu_serving.py --device cuda              # on a lent GPU
    python benchmarks/bench_gpu_serving.py --device cpu --small       # dry run, well under 1 min
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
# NOTE: the root last (an uninstalled tree), so an installed `kernels` package comes before the
# root's kernels/ folder (grammarserve/source_paths.py)
sys.path.append(str(ROOT))

import jsonschema
import torch
from gpu_serving_workload import (
    SCHEMAS,
    GpuPeak,
    ModelBytes,
    RequestSpec,
    WorkloadShape,
    decode_roofline_ms,
    gpu_peak,
    load_schema,
    model_bytes,
    percentiles,
    prefill_roofline_tokens_s,
    requests,
)
from machine import stamp
from random_models import llama_config, random_model_on
from sync_count import SyncCounter

from grammarserve.config import EngineConfig
from grammarserve.engine.engine import Engine
from grammarserve.engine.request import Req, RequestOutput
from grammarserve.models.config import ModelConfig
from grammarserve.models.loader import LoadedModel, load_tokenizer, resolve_model_folder

#: The --small dry run's decoder: tiny layers, the big shapes' padded vocabulary (as the GPU run
#: has it: 128256 ids over a 49152-token tokenizer, so grammars mask the padding).
SMALL_SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
#: Steady decode steps left out at the start of each wave (first use, graph replay set-up).
SKIP_STEADY = 2


def log(msg: str) -> None:
    print(f"[gpu-serving {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Track:
    """One request as the benchmark sees it."""

    spec: RequestSpec
    req: Req
    t_add: float
    t_first: float | None = None
    t_last: float | None = None
    tokens: int = 0
    gaps: list[float] = field(default_factory=list)
    out: RequestOutput | None = None


@dataclass
class Steps:
    """The timed steps of one point."""

    steady_ms: list[float] = field(default_factory=list)
    steady_context: list[int] = field(default_factory=list)
    prefill_tokens: int = 0
    prefill_s: float = 0.0


def build_engine(shape: str, small: bool, device: torch.device, tokenizer_dir: Path,
                 max_batch: int, context: int, args: argparse.Namespace) -> Engine:
    """An engine over a random model of ``shape`` (weights drawn on ``device``)."""
    cfg_json = llama_config("llama-3.2-1b" if small else shape)
    if small:
        cfg_json.update(SMALL_SHAPE)
    cfg = ModelConfig.from_hf_dict(cfg_json)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = random_model_on(cfg, dtype, device)
    loaded = LoadedModel(model, cfg, load_tokenizer(tokenizer_dir, None), tokenizer_dir,
                         f"random {shape}")
    config = EngineConfig(model=str(tokenizer_dir), device=device.type,
                          dtype="bfloat16" if device.type == "cuda" else "float32",
                          kv_cache_tokens=max_batch * context + 1024, max_model_len=context,
                          max_num_reqs=max_batch, max_batch_tokens=args.max_batch_tokens,
                          enable_prefix_cache=False, adaptive_batch=False,
                          num_speculative_tokens=args.spec, grammar_disk_cache=None,
                          grammar_json_style=args.json_style)
    engine = Engine(config, loaded=loaded)
    engine.warm_up()
    return engine


def run_point(engine: Engine, specs: list[RequestSpec], batch: int,
              syncs: SyncCounter, sync_steps: int) -> tuple[list[Track], Steps, float]:
    """Serve ``specs`` in waves of ``batch``; the tracks, the timed steps and the wall time."""
    tracks: dict[str, Track] = {}
    steps = Steps()
    t_start = time.perf_counter()
    for w in range(0, len(specs), batch):
        wave = specs[w:w + batch]
        for s in wave:
            engine.add_request(s.request_id, s.prompt_ids, s.params)
            tracks[s.request_id] = Track(s, engine.requests[s.request_id], time.perf_counter())
        live = [tracks[s.request_id] for s in wave]
        steady_seen = 0
        while engine.has_unfinished():
            running = [t.req for t in live if t.out is None]
            before = sum(min(r.num_computed, len(r.prompt_ids)) for r in running)
            steady = len(running) == batch and all(
                r.num_computed >= len(r.prompt_ids) for r in running)
            context = sum(r.num_computed + 1 for r in running)
            watch = steady and steady_seen >= SKIP_STEADY and syncs.active and \
                syncs.steps < sync_steps
            t0 = time.perf_counter()
            if watch:
                with syncs.watch():
                    outs = engine.step()
            else:
                outs = engine.step()
            now = time.perf_counter()
            prompt_done = sum(min(r.num_computed, len(r.prompt_ids)) for r in running) - before
            if prompt_done > 0:
                steps.prefill_tokens += prompt_done
                steps.prefill_s += now - t0
            elif steady:
                if steady_seen >= SKIP_STEADY and not watch:
                    steps.steady_ms.append(1000 * (now - t0))
                    steps.steady_context.append(context)
                steady_seen += 1
            for out in outs:
                _record(tracks[out.request_id], out, now)
    return list(tracks.values()), steps, time.perf_counter() - t_start


def _record(t: Track, out: RequestOutput, now: float) -> None:
    if len(out.token_ids) > t.tokens:
        if t.t_first is None:
            t.t_first = now
        elif t.t_last is not None:
            t.gaps.append(now - t.t_last)
        t.t_last = now
        t.tokens = len(out.token_ids)
    if out.finished:
        t.out = out


def valid_reply(t: Track) -> bool:
    """Whether a constrained request's reply parses and validates against its schema."""
    assert t.spec.schema_name is not None and t.out is not None
    try:
        jsonschema.validate(json.loads(t.out.text), load_schema(t.spec.schema_name))
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def summarize(tracks: list[Track], steps: Steps, wall: float, batch: int, mb: ModelBytes,
              peak: GpuPeak | None) -> dict[str, Any]:
    """The JSON figures of one point (see the module docstring)."""
    done = [t for t in tracks if t.out is not None]
    constrained = [t for t in done if t.spec.schema_name is not None]
    stopped = [t for t in constrained if t.out is not None and t.out.finish_reason == "stop"]
    out_tokens = sum(len(t.out.token_ids) for t in done if t.out is not None)
    ms = percentiles(steps.steady_ms)["p50"]
    ctx = sum(steps.steady_context) / len(steps.steady_context) if steps.steady_context else 0
    roof_ms = decode_roofline_ms(mb, ctx, peak) if ms is not None else None
    pf_rate = steps.prefill_tokens / steps.prefill_s if steps.prefill_s else None
    pf_roof = prefill_roofline_tokens_s(mb, peak)
    return {
        "batch": batch, "requests": len(tracks), "finished": len(done),
        "errors": sum(t.out is not None and t.out.finish_reason == "error" for t in done),
        "constrained": len(constrained), "constrained_stopped": len(stopped),
        "constrained_valid": sum(valid_reply(t) for t in stopped),
        "wall_s": round(wall, 3), "requests_per_s": round(len(done) / wall, 3),
        "output_tokens": out_tokens, "output_tokens_per_s": round(out_tokens / wall, 1),
        "decode": {"steady_steps": len(steps.steady_ms), "ms_per_step": ms,
                   "tokens_per_s": round(batch * 1000 / ms, 1) if ms else None,
                   "context_tokens_mean": round(ctx, 1),
                   "roofline_ms": None if roof_ms is None else round(roof_ms, 3),
                   "x_roofline": None if roof_ms is None or ms is None
                   else round(ms / roof_ms, 3)},
        "prefill": {"tokens": steps.prefill_tokens, "s": round(steps.prefill_s, 3),
                    "tokens_per_s": None if pf_rate is None else round(pf_rate, 1),
                    "roofline_tokens_per_s": None if pf_roof is None else round(pf_roof, 1),
                    "of_roofline": None if pf_rate is None or pf_roof is None
                    else round(pf_rate / pf_roof, 3)},
        "ttft_ms": percentiles([1000 * (t.t_first - t.t_add) for t in done
                                if t.t_first is not None]),
        "itl_ms": percentiles([1000 * g for t in done for g in t.gaps]),
    }


def ratios(points: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float | None]]]:
    """By batch, then fraction: constrained over unconstrained tokens/s (steady decode, and
    all output)."""
    base = {p["batch"]: p for p in points if p["constrained_fraction"] == 0}
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for p in points:
        b, f = p["batch"], p["constrained_fraction"]
        if f == 0 or b not in base:
            continue
        u = base[b]
        dec = (p["decode"]["tokens_per_s"] / u["decode"]["tokens_per_s"]
               if p["decode"]["tokens_per_s"] and u["decode"]["tokens_per_s"] else None)
        outp = (p["output_tokens_per_s"] / u["output_tokens_per_s"]
                if u["output_tokens_per_s"] else None)
        out.setdefault(str(b), {})[str(f)] = {
            "decode": None if dec is None else round(dec, 3),
            "output": None if outp is None else round(outp, 3)}
    return out


def bench_shape(shape: str, args: argparse.Namespace, device: torch.device, peak: GpuPeak | None,
                replies: list[dict[str, Any]]) -> dict[str, Any]:
    """Every (fraction, batch) point of one shape, on one engine."""
    context = args.prompt_hi + max(args.max_tokens, args.constrained_max_tokens) + 8
    engine = build_engine(shape, args.small, device, args.tokenizer_dir, max(args.batches),
                          context, args)
    mb = model_bytes(engine.loaded.model, engine.kv_bytes_per_token)
    syncs = SyncCounter(device)
    wl = WorkloadShape(args.prompt_lo, args.prompt_hi, args.max_tokens,
                       args.constrained_max_tokens, token_lo=100,
                       token_hi=min(len(engine.tokenizer), engine.vocab_size))
    for name in SCHEMAS:  # NOTE: compiles outside the timed points
        engine.grammar.compiler.compile_json_schema(load_schema(name))
    # NOTE: a throwaway wave first (first use of the kernels and of each code path)
    run_point(engine, requests(2, 0.5, wl, f"{shape}-warm"), 2, syncs, 0)
    points = []
    for frac in args.fractions:
        for batch in args.batches:
            specs = requests(batch * args.waves, frac, wl, f"{shape}-{frac}-{batch}")
            log(f"{shape} fraction {frac} batch {batch}: {len(specs)} requests")
            tracks, steps, wall = run_point(engine, specs, batch, syncs, args.sync_steps)
            point = {"constrained_fraction": frac, **summarize(tracks, steps, wall, batch, mb,
                                                               peak)}
            points.append(point)
            log(f"  decode {point['decode']['ms_per_step']} ms/step "
                f"(x{point['decode']['x_roofline']} roofline), "
                f"{point['requests_per_s']} req/s, ttft p50 {point['ttft_ms']['p50']} ms")
            replies += [{"shape": shape, "schema": t.spec.schema_name, "text": t.out.text,
                         "finish": t.out.finish_reason} for t in tracks
                        if t.spec.schema_name is not None and t.out is not None]
    ring = engine.grammar.bitmask_ring
    result = {"weights_gib": round(mb.decode_weight_bytes / 2**30, 3),
              "layer_params": mb.layer_params, "kv_bytes_per_token": mb.kv_bytes_per_token,
              "vocab_size": engine.vocab_size, "tokenizer_tokens": len(engine.tokenizer),
              "points": points, "ratios": ratios(points), "syncs": syncs.as_json(),
              "bitmask_ring": {"depth": ring.depth, "pinned": ring.pinned,
                               "sends": ring.stats.sends, "waits": ring.stats.waits}}
    engine.close()
    del engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true",
                    help="dry run: a tiny decoder, batches 1 and 4, short prompts and replies")
    ap.add_argument("--shapes", default=None, help="comma-separated (llama-3.2-1b,llama-3.1-8b)")
    ap.add_argument("--batches", type=_ints, default=None)
    ap.add_argument("--fractions", type=_floats, default=[0.0, 0.5, 1.0])
    ap.add_argument("--waves", type=int, default=2, help="waves of `batch` requests per point")
    ap.add_argument("--prompt-lo", type=int, default=None)
    ap.add_argument("--prompt-hi", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--constrained-max-tokens", type=int, default=None)
    ap.add_argument("--max-batch-tokens", type=int, default=2048)
    ap.add_argument("--json-style", default="compact",
                    help="grammar_json_style (compact: random weights would fill the "
                         "flexible style's whitespace runs)")
    ap.add_argument("--spec", type=int, default=0, help="num_speculative_tokens (0: off)")
    ap.add_argument("--sync-steps", type=int, default=3, help="steady steps under sync-debug")
    ap.add_argument("--peak-bw-gbs", type=float, default=None,
                    help="peak memory bandwidth, GB/s (else by GPU name; a CPU has none)")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="peak dense bf16 TFLOP/s (else by GPU name)")
    ap.add_argument("--tokenizer-dir", type=Path, default=None,
                    help="the SmolLM2 tokenizer files (default .smoke/smollm2, else the "
                         "embedded model's folder)")
    ap.add_argument("--replies", type=Path, default=None,
                    help="write the constrained replies here (JSON lines) for checking")
    args = ap.parse_args(argv)
    small = args.small
    args.shapes = (args.shapes or ("tiny" if small else "llama-3.2-1b,llama-3.1-8b")).split(",")
    args.batches = args.batches or ([1, 4] if small else [1, 8, 32, 128, 256])
    args.prompt_lo = args.prompt_lo or (16 if small else 64)
    args.prompt_hi = args.prompt_hi or (64 if small else 2048)
    args.max_tokens = args.max_tokens or (8 if small else 128)
    args.constrained_max_tokens = args.constrained_max_tokens or 256
    if args.tokenizer_dir is None:
        smoke = ROOT / ".smoke" / "smollm2"
        args.tokenizer_dir = smoke if smoke.is_dir() else resolve_model_folder("default")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device (use --device cpu --small)")
    gpu = torch.cuda.get_device_properties(device).name if device.type == "cuda" else None
    peak = gpu_peak(gpu, args.peak_bw_gbs, args.peak_tflops)
    result: dict[str, Any] = {
        **stamp(), "bench": "gpu_serving", "device": device.type, "gpu": gpu,
        "torch": torch.__version__, "small": args.small,
        "peak": None if peak is None else {"bandwidth_gbs": peak.bandwidth_bytes_s / 1e9,
                                           "bf16_tflops": peak.bf16_flops / 1e12},
        "workload": {"batches": args.batches, "fractions": args.fractions,
                     "waves": args.waves, "prompt_tokens": [args.prompt_lo, args.prompt_hi],
                     "max_tokens": args.max_tokens,
                     "constrained_max_tokens": args.constrained_max_tokens,
                     "schemas": list(SCHEMAS), "spec": args.spec,
                     "json_style": args.json_style},
        "shapes": {}}
    t0 = time.monotonic()
    replies: list[dict[str, Any]] = []
    for shape in args.shapes:
        log(f"shape {shape}")
        result["shapes"][shape] = bench_shape(shape, args, device, peak, replies)
    result["seconds"] = round(time.monotonic() - t0, 1)
    if args.replies is not None:
        args.replies.write_text("".join(json.dumps(r) + "\n" for r in replies))
    print(json.dumps(result, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
