"""The engine-level sections of benchmarks/gpu_smoke.py (each returns a JSON-able dict)."""

from __future__ import annotations

import json
import statistics
import time
import warnings
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from smoke_verdict import ROUND_TRIP_TOKENS, near_tie_threshold

from grammarserve.attention.backend import AttentionBackend, TorchSDPABackend
from grammarserve.attention.forward_batch import ForwardBatch
from grammarserve.attention.kv_pool import KVPool, ReqToTokenPool
from grammarserve.attention.paged_decode import PagedDecodeBackend
from grammarserve.attention.varlen import VarlenBackend
from grammarserve.config import EngineConfig
from grammarserve.constraints import Constraint
from grammarserve.engine.engine import Engine
from grammarserve.engine.model_runner import BatchEntry, ModelRunner
from grammarserve.engine.request import RequestOutput
from grammarserve.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small",
           "List three colors:"]
# Long property names and enum values: most of the reply is forced (jump-forward spans).
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "customer_account_classification_category": {
            "enum": ["enterprise_premium_support_tier_with_dedicated_manager",
                     "standard_community_support_tier"]},
        "has_completed_identity_verification_process": {"type": "boolean"},
        "preferred_communication_channel_for_notifications": {
            "enum": ["electronic_mail_weekly_newsletter_digest", "short_message_service"]}},
    "required": ["customer_account_classification_category",
                 "has_completed_identity_verification_process",
                 "preferred_communication_channel_for_notifications"],
    "additionalProperties": False}


def _engine(folder: Path, device: torch.device, **kw: Any) -> Engine:
    base: dict[str, Any] = {"model": str(folder), "device": str(device),
                            "kv_cache_tokens": 8192, "max_num_reqs": 16,
                            "decode_attention_kernel": False, "decode_stack_kernel": False}
    return Engine(EngineConfig(**{**base, **kw}))


def _run(engine: Engine, reqs: dict[str, tuple[list[int], SamplingParams]]
         ) -> dict[str, RequestOutput]:
    for rid, (ids, params) in reqs.items():
        engine.add_request(rid, ids, params)
    done: dict[str, RequestOutput] = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return done


def _prompt_ids(engine: Engine) -> list[list[int]]:
    return [engine.tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]


def _teacher_forced(engine: Engine, seqs: list[list[int]]) -> list[torch.Tensor]:
    """fp32 logits at every position of each sequence (one fresh prefill each)."""
    r = engine.runner
    out = []
    for seq in seqs:
        row = r.req_to_token.alloc()
        slots = r.pool.alloc(len(seq))
        r.req_to_token.write(row, 0, slots)
        batch = r.build_batch([BatchEntry(row, 0, seq)])
        batch.logit_rows = torch.arange(len(seq), device=r.device)
        out.append(r.model(batch, r.attn).float().cpu())
        r.pool.free(slots)
        r.req_to_token.free(row)
    return out


def greedy_parity(folder: Path, device: torch.device, small: bool) -> dict[str, Any]:
    """4 prompts x 32 greedy tokens: CPU fp32 (reference) vs ``device`` fp32 (no TF32) and bf16;
    then all three teacher-forced on the reference tokens, for fp32 noise, top-2 margins and
    bf16 argmax agreement."""
    greedy = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    runs: dict[str, Engine] = {}
    tokens: dict[str, list[list[int]]] = {}
    for name, dev, dtype, graphs in (("cpu_fp32", torch.device("cpu"), "float32", False),
                                     ("fp32", device, "float32", True),
                                     ("fp32_eager", device, "float32", False),
                                     ("bf16", device, "bfloat16", True)):
        engine = _engine(folder, dev, dtype=dtype, tf32=False, cuda_graphs=graphs)
        prompts = _prompt_ids(engine)
        done = _run(engine, {str(i): (p, greedy) for i, p in enumerate(prompts)})
        tokens[name] = [done[str(i)].token_ids for i in range(len(prompts))]
        runs[name] = engine
    ref = tokens["cpu_fp32"]
    seqs = [p + t for p, t in zip(_prompt_ids(runs["cpu_fp32"]), ref)]
    logits = {k: _teacher_forced(e, seqs) for k, e in runs.items() if k != "fp32_eager"}
    gen = [slice(len(s) - len(t) - 1, len(s) - 1) for s, t in zip(seqs, ref)]
    cpu = torch.cat([x[g] for x, g in zip(logits["cpu_fp32"], gen)])
    f32 = torch.cat([x[g] for x, g in zip(logits["fp32"], gen)])
    b16 = torch.cat([x[g] for x, g in zip(logits["bf16"], gen)])
    noise = float((cpu - f32).abs().max())
    top2 = cpu.topk(2, dim=-1).values
    margin = top2[:, 0] - top2[:, 1]
    threshold = near_tie_threshold(noise)
    margins = margin.split([len(t) for t in ref])  # per prompt, per generated token

    def first_diff(a: list[int], b: list[int]) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    def diverged(name: str) -> list[dict[str, Any]]:
        """Where each prompt's greedy tokens first leave the reference, with the reference's
        top-2 margin there (a difference is acceptable only at a near tie)."""
        out = []
        for i, (a, b) in enumerate(zip(ref, tokens[name])):
            if a != b:
                d = first_diff(a, b)
                out.append({"prompt": i, "token": d,
                            "top2_margin": float(margins[i][min(d, len(a) - 1)])})
        return out

    fp32_equal = sum(a == b for a, b in zip(ref, tokens["fp32"]))
    return {
        "decode_graphs": (None if runs["fp32"].runner.graphs is None
                          else runs["fp32"].runner.graphs.failed or "captured"),
        "fp32_eager_equal_prompts": sum(a == b for a, b in zip(ref, tokens["fp32_eager"])),
        "prompts": len(ref), "tokens_each": 32,
        "fp32_equal_prompts": fp32_equal,
        "fp32_first_diff": [first_diff(a, b) for a, b in zip(ref, tokens["fp32"])],
        "fp32_diverged": diverged("fp32"), "fp32_eager_diverged": diverged("fp32_eager"),
        "bf16_first_diff": [first_diff(a, b) for a, b in zip(ref, tokens["bf16"])],
        "fp32_max_abs_logit_diff": noise,
        "logit_std": round(float(cpu.std()), 3),
        "top2_margin_median": round(float(margin.median()), 4),
        "near_tie_threshold": threshold,
        "near_tie_fraction": round(float((margin < threshold).float().mean()), 4),
        "bf16_teacher_forced_argmax_agreement": round(float(
            (b16.argmax(-1) == cpu.argmax(-1)).float().mean()), 4),
        "bf16_max_abs_logit_diff": round(float((cpu - b16).abs().max()), 4),
    }


def engine_paths(folder: Path, device: torch.device) -> dict[str, Any]:
    """Shared-prefix pair (the second request reuses the first's KV) and a JSON-schema request
    with long forced spans, on ``device`` in the engine's default dtype. The spans are jumped
    forward only with ``json_schema_spans`` (off by default), and forced only in the compact
    style (the default flexible one lets whitespace come between any two tokens); with the
    defaults the CPU dry run forced 1 token of 123."""
    import jsonschema

    engine = _engine(folder, device, grammar_json_style="compact", json_schema_spans=True)
    g = torch.Generator().manual_seed(7)
    prefix = torch.randint(100, 40000, (700,), generator=g).tolist()
    suffixes = [torch.randint(100, 40000, (20,), generator=g).tolist() for _ in range(2)]
    greedy = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    a = _run(engine, {"a": (prefix + suffixes[0], greedy)})["a"]
    b = _run(engine, {"b": (prefix + suffixes[1], greedy)})["b"]
    fresh = _engine(folder, device, enable_prefix_cache=False)
    b_fresh = _run(fresh, {"b": (prefix + suffixes[1], greedy)})["b"]
    group = _run(engine, {f"g{i}": (prefix + s, greedy) for i, s in enumerate(
        [suffixes[0], suffixes[1], suffixes[0][:7], suffixes[1][:3]])})
    js = SamplingParams(max_tokens=200, temperature=0,
                        constraint=Constraint.json_schema(SCHEMA))
    before = engine.stats().jump_forward_tokens
    outs = _run(engine, {"json": (engine.tokenizer.encode("Customer record as JSON:"), js)})
    out = outs["json"]
    valid = False
    try:
        jsonschema.validate(json.loads(out.text), SCHEMA)
        valid = True
    except (ValueError, jsonschema.ValidationError):
        pass
    forced = engine.stats().jump_forward_tokens - before
    return {"dtype": str(engine.config.torch_dtype), "backend": engine.config.attention_backend,
            "prefix_cached_tokens": b.num_cached_tokens, "a_cached": a.num_cached_tokens,
            "cached_equals_uncached": b.token_ids == b_fresh.token_ids,
            "shared_prefix_group_cached": [group[f"g{i}"].num_cached_tokens for i in range(4)],
            "json_valid": valid, "json_finish": out.finish_reason,
            "json_tokens": len(out.token_ids), "json_forced_tokens": forced,
            "json_text": out.text[:300]}


def sync_listing(folder: Path, device: torch.device) -> dict[str, Any]:
    """One decode step (4 requests, one constrained) under sync-debug "warn": the syncs left,
    counted by the repository file:line they were issued from."""
    if device.type != "cuda":
        return {"skipped": "CUDA only"}
    engine = _engine(folder, device)
    greedy = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    js = SamplingParams(max_tokens=64, temperature=0, constraint=Constraint.json_schema(SCHEMA))
    ids = _prompt_ids(engine)
    for i, p in enumerate(ids[:3]):
        engine.add_request(str(i), p, greedy)
    engine.add_request("json", ids[3], js)
    for _ in range(6):  # prefill, compile, warm the kernels
        engine.step()
    torch.cuda.synchronize()
    counts: Counter[str] = Counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            t0 = time.perf_counter()
            engine.step()
            step_ms = 1000 * (time.perf_counter() - t0)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    for w in caught:
        if "synchroniz" in str(w.message):
            path = Path(w.filename)
            where = (str(path.relative_to(ROOT)) if path.is_relative_to(ROOT)
                     else "/".join(path.parts[-3:]))
            counts[f"{where}:{w.lineno}"] += 1
    return {"syncs": sum(counts.values()), "by_line": dict(counts.most_common()),
            "step_ms": round(step_ms, 2)}


def engine_process_round_trip(folder: Path, device: torch.device) -> dict[str, Any]:
    """Start an EngineProcess (spawned child), one request, stats, shutdown."""
    from grammarserve.engine.process import EngineProcess

    t0 = time.monotonic()
    # KV sized from memory (mem_get_info on CUDA): 5% of what is free after the weights
    proc = EngineProcess(EngineConfig(model=str(folder), device=str(device),
                                      kv_memory_fraction=0.05, max_num_reqs=8,
                                      decode_attention_kernel=False, decode_stack_kernel=False))
    try:
        started = time.monotonic() - t0
        proc_info = {k: v for k, v in proc.info.items() if isinstance(v, (str, int, float))}
        out = proc.add_request("r", "Hello", SamplingParams(max_tokens=ROUND_TRIP_TOKENS,
                                                             temperature=0,
                                                             ignore_eos=True)).result(timeout=120)
        stats = proc.stats()
    finally:
        proc.shutdown()
    return {"start_s": round(started, 1), "tokens": len(out.token_ids),
            "finish": out.finish_reason, "generated_total": stats.generated_tokens,
            "kv_capacity": stats.kv_capacity, "info": proc_info}


def _attn_case(backend: str, device: torch.device, b: int, ctx: int, ext: int,
               heads: int, kv: int, d: int) -> dict[str, Any]:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    pool = KVPool(capacity=b * ctx + 8, num_layers=1, num_kv_heads=kv, head_dim=d, dtype=dtype,
                  device=device)
    pool.k[0].normal_()
    pool.v[0].normal_()
    table = ReqToTokenPool(max_reqs=b, max_context=ctx, device=device)
    for r in range(b):
        table.write(r, 0, pool.alloc(ctx))
    attn: AttentionBackend = (VarlenBackend(pool, table) if backend == "varlen"
                              else PagedDecodeBackend(pool, table) if backend == "paged"
                              else TorchSDPABackend(pool, table, mirror_tokens=0))
    stub = torch.nn.Module()  # no forward here: the runner only builds the batch
    stub.config = SimpleNamespace(vocab_size=2)  # type: ignore[assignment]  # token id 1 below
    runner = ModelRunner(stub, pool, table, attn)  # type: ignore[arg-type]
    batch: ForwardBatch = runner.build_batch([BatchEntry(r, ctx - ext, [1] * ext, r)
                                              for r in range(b)])
    q = torch.randn(b * ext, heads, d, dtype=dtype, device=device)
    k = torch.randn(b * ext, kv, d, dtype=dtype, device=device)
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    for _ in range(6):
        t0 = time.perf_counter()
        attn.prepare(batch)
        o = attn.forward(0, q, k, k)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(1000 * (time.perf_counter() - t0))
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if device.type == "cuda" else 0
    return {"ms": round(statistics.median(times[1:]), 3), "transient_mib": round(peak, 1),
            "out": o.float()}


def attention_bench(device: torch.device, small: bool) -> dict[str, Any]:
    """One attention layer of the 8B shape (32 heads, 8 KV heads, d=128), prepare + forward:
    decode groups (32 x 4096 and 1 x 16384 context) and a 2048-token chunk over an 8192-token prefix; the
    varlen backend against the torch SDPA backend (boolean mask + enable_gqa, no mirror) and,
    for decode, the paged kernel of the CUDA-graph path (eager here)."""
    heads, kv, d = (4, 2, 16) if small else (32, 8, 128)
    cases = {"decode_b32_ctx4096": (32, 4096, 1), "decode_b1_ctx16384": (1, 16384, 1),
             "chunk2048_over_8192": (1, 10240, 2048)}
    if small:
        cases = {"decode_b4_ctx64": (4, 64, 1), "chunk16_over_48": (1, 64, 16)}
    out: dict[str, Any] = {"dtype": "bfloat16" if device.type == "cuda" else "float32"}
    for name, (b, ctx, ext) in cases.items():
        backends = ("varlen", "torch", "paged") if ext == 1 else ("varlen", "torch")
        torch.manual_seed(0)  # the same K/V pool and queries for every backend
        res = {}
        for be in backends:
            torch.manual_seed(0)
            res[be] = _attn_case(be, device, b, ctx, ext, heads, kv, d)
        ref = res["torch"].pop("out")
        for be in backends:
            if be != "torch":
                diff = float((res[be].pop("out") - ref).abs().max())
                res[be]["max_abs_diff_vs_torch"] = float(f"{diff:.3g}")
        out[name] = res
    return out


def engine_decode(folder: Path, device: torch.device) -> dict[str, Any]:
    """Engine.step() on 32 greedy requests of the SmolLM2 shape (scheduler, sampler,
    detokenizer and all), CUDA graphs on and off: steady decode ms per step and tokens/s."""
    out: dict[str, Any] = {}
    for graphs in (True, False):
        engine = _engine(folder, device, cuda_graphs=graphs, max_num_reqs=32)
        g = torch.Generator().manual_seed(3)
        for i in range(32):
            engine.add_request(str(i), torch.randint(100, 40000, (64,), generator=g).tolist(),
                               SamplingParams(max_tokens=48, temperature=0, ignore_eos=True))
        times = []
        while engine.has_unfinished():
            t0 = time.perf_counter()
            outs = engine.step()
            if len(outs) == 32 and not any(o.finished for o in outs):
                times.append(time.perf_counter() - t0)
        times = sorted(times[4:])  # past the prefill step and the captures
        ms = 1000 * statistics.median(times) if times else float("nan")
        out["graphs" if graphs else "eager"] = {"ms_per_step": round(ms, 3),
                                                "tokens_per_s": round(32_000 / ms, 1),
                                                "steps": len(times)}
    return out
