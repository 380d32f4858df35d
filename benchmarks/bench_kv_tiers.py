"""KV tiers under the radix cache (issue 39) on a multi-tenant agent workload.

``--tenants`` tenants, each with its own ``--preamble``-token system prompt, send ``--rounds``
rounds of requests interleaved (tenant 0..T-1, then again), ``--concurrency`` in flight; the
preambles together are several times the KV pool (``--pool`` tokens), so without tiers a
tenant's preamble is evicted before it comes back. The same workload runs with each config
(no tiers; host tier; disk tier only; host tier stored as fp16) on one engine build each, in
one process; then a restart check in fresh processes: a first process computes some tenants'
preambles into an empty disk tier and exits; a second, new process on that folder serves one
request on a known preamble; a third, without tiers, serves it cold.

Prints one JSON line: per config the prefill tokens computed, TTFT p50/p95, wall time, tier
hits, and the greedy outputs' agreement with the no-tier run; the ratios; the restart TTFTs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import statistics
import sys
import tempfile
import time
from typing import Any

from machine import stamp

from grammarserve.config import EngineConfig
from grammarserve.engine.engine import Engine
from grammarserve.models.loader import LoadedModel, load_model
from grammarserve.sampling_params import SamplingParams

WORDS = ("refund shipping invoice warranty ticket escalation priority customer account order "
         "delivery region policy exception approval manager discount return carrier tracking "
         "damage replacement credit balance subscription renewal cancellation notice").split()


def preamble_ids(engine: Engine, tenant: int, tokens: int) -> list[int]:
    """Tenant ``tenant``'s system prompt, cut to ``tokens`` tokens (deterministic)."""
    rng = random.Random(tenant)
    lines = [f"You are the support agent of tenant {tenant}. Follow its rules below."]
    while len(engine.tokenizer.encode(" ".join(lines))) < tokens + 16:
        lines.append(f"Rule {len(lines)}: " + " ".join(rng.choice(WORDS) for _ in range(14))
                     + f" within {rng.randint(1, 90)} days.")
    return engine.tokenizer.encode(" ".join(lines))[:tokens]


def prompt_ids(engine: Engine, pre: list[int], question: str) -> list[int]:
    system = engine.tokenizer.decode(pre)
    text = engine.tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": question}],
        tokenize=False, add_generation_prompt=True)
    return list(engine.tokenizer.encode(text))


def workload(engine: Engine, tenants: int, pre_tokens: int,
             rounds: int) -> list[tuple[str, list[int]]]:
    pres = [preamble_ids(engine, t, pre_tokens) for t in range(tenants)]
    return [(f"r{r}-t{t}", prompt_ids(engine, pres[t], f"Round {r}: what does rule {r + 3} "
                                      f"say for order {1000 * t + r}?"))
            for r in range(rounds) for t in range(tenants)]


def run(engine: Engine, reqs: list[tuple[str, list[int]]], concurrency: int,
        max_tokens: int) -> dict[str, Any]:
    """Closed loop: ``concurrency`` requests in flight; TTFT from queueing to first token."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    todo, added, ttft, outputs = list(reqs), {}, {}, {}
    before = engine.stats()
    t0 = time.perf_counter()
    while todo or engine.has_unfinished():
        while todo and len(added) - len(outputs) < concurrency:
            rid, ids = todo.pop(0)
            engine.add_request(rid, ids, params)
            added[rid] = time.perf_counter()
        for out in engine.step():
            if out.token_ids and out.request_id not in ttft:
                ttft[out.request_id] = time.perf_counter() - added[out.request_id]
            if out.finished:
                outputs[out.request_id] = list(out.token_ids)
    wall = time.perf_counter() - t0
    if engine.tiers is not None:
        engine.tiers.flush(120)
    s = engine.stats()
    prompt = s.prompt_tokens - before.prompt_tokens
    cached = s.cached_prompt_tokens - before.cached_prompt_tokens
    times = sorted(ttft.values())
    # NOTE: a tenant's first request is cold with or without tiers; later ones show the tiers
    again = sorted(v for k, v in ttft.items() if not k.startswith("r0-"))
    return {"requests": len(outputs), "prompt_tokens": prompt, "prefill_tokens": prompt - cached,
            "ttft_p50_s": round(statistics.median(times), 4),
            "ttft_p95_s": round(times[min(len(times) - 1, int(0.95 * len(times)))], 4),
            "ttft_p95_returning_s": round(again[min(len(again) - 1, int(0.95 * len(again)))], 4)
            if again else None,
            "wall_s": round(wall, 2),
            "host_hit_tokens": s.kv_host_hit_tokens, "disk_hit_tokens": s.kv_disk_hit_tokens,
            "demoted_tokens": s.kv_demoted_tokens, "promote_s": round(s.kv_promote_s, 3),
            "host_tier_bytes": s.kv_host_tier_bytes, "disk_tier_bytes": s.kv_disk_tier_bytes,
            "disk_writes": s.kv_disk_tier_writes, "disk_dropped": s.kv_disk_tier_dropped,
            "_outputs": outputs}


def _config(args: argparse.Namespace, **kw: Any) -> EngineConfig:
    return EngineConfig(device="cpu", kv_cache_tokens=args.pool, max_num_reqs=args.concurrency,
                        num_speculative_tokens=0, **kw)


CONFIGS = {
    "none": {"kv_host_tier_bytes": 0},
    "host": {"kv_host_tier_bytes": 8 * 1024**3},
    "disk": {"kv_host_tier_bytes": 0, "kv_disk_tier": "<tmp>"},
    "host_fp16": {"kv_host_tier_bytes": 8 * 1024**3, "kv_tier_dtype": "float16"},
}


def _restart_child(kind: str, args: argparse.Namespace, folder: str, queue: Any) -> None:
    """One process of the restart check: ``fill`` computes tenants' preambles into ``folder``;
    ``warm`` and ``cold`` time one request on tenant 0's preamble (with the disk tier /
    without tiers) after a warm-up request on another prompt."""
    tier = {"kv_host_tier_bytes": 0, "kv_disk_tier": folder} if kind != "cold" else \
        {"kv_host_tier_bytes": 0}
    engine = Engine(_config(args, **tier), loaded=load_model("default"))
    if kind == "fill":
        reqs = workload(engine, args.restart_tenants, args.preamble, 1)
        run(engine, reqs, args.concurrency, args.max_tokens)
        engine.close()
        queue.put({"filled": len(reqs)})
        return
    warm = prompt_ids(engine, preamble_ids(engine, 999, 200), "Warm-up.")
    run(engine, [("warmup", warm)], 1, 2)
    pre = preamble_ids(engine, 0, args.preamble)
    res = run(engine, [("first", prompt_ids(engine, pre, "After the restart: rule 9?"))], 1,
              args.max_tokens)
    engine.close()
    queue.put({"ttft_s": res["ttft_p50_s"], "disk_hit_tokens": res["disk_hit_tokens"],
               "prefill_tokens": res["prefill_tokens"], "tokens": res["_outputs"]["first"]})


def restart_check(args: argparse.Namespace) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="kv-tier-") as folder:
        for kind in ("fill", "warm", "cold"):
            q = ctx.Queue()
            p = ctx.Process(target=_restart_child, args=(kind, args, folder, q))
            p.start()
            out[kind] = q.get(timeout=1800)
            p.join()
    warm, cold = out["warm"], out["cold"]
    return {"first_request_ttft_s": warm["ttft_s"], "cold_ttft_s": cold["ttft_s"],
            "ratio": round(warm["ttft_s"] / cold["ttft_s"], 3),
            "disk_hit_tokens": warm["disk_hit_tokens"],
            "prefill_tokens": {"restarted": warm["prefill_tokens"],
                               "cold": cold["prefill_tokens"]},
            "same_tokens": warm["tokens"] == cold["tokens"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tenants", type=int, default=16)
    ap.add_argument("--preamble", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--pool", type=int, default=8192)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--restart-tenants", type=int, default=4)
    ap.add_argument("--no-restart", dest="restart", action="store_false")
    args = ap.parse_args()
    head = stamp()  # NOTE: the code measured is the checkout at the start
    loaded: LoadedModel = load_model("default")
    results: dict[str, Any] = {}
    for name in args.configs.split(","):
        with tempfile.TemporaryDirectory(prefix="kv-tier-") as folder:
            kw = {k: (folder if v == "<tmp>" else v) for k, v in CONFIGS[name].items()}
            engine = Engine(_config(args, **kw), loaded=loaded)
            reqs = workload(engine, args.tenants, args.preamble, args.rounds)
            results[name] = run(engine, reqs, args.concurrency, args.max_tokens)
            engine.close()
        print(name, {k: v for k, v in results[name].items() if k != "_outputs"},
              file=sys.stderr, flush=True)
    outputs = {name: r.pop("_outputs") for name, r in results.items()}
    base = results.get("none")
    for name, r in results.items():
        if base is None or name == "none":
            continue
        ref = outputs["none"]
        r["same_tokens_as_none"] = round(sum(outputs[name][k] == ref[k] for k in ref) / len(ref), 3)
        r["prefill_ratio_vs_none"] = round(base["prefill_tokens"] / max(1, r["prefill_tokens"]), 2)
        r["ttft_p95_ratio_vs_none"] = round(r["ttft_p95_s"] / base["ttft_p95_s"], 3)
        if r["ttft_p95_returning_s"] is not None:
            r["ttft_p95_returning_ratio_vs_none"] = round(
                r["ttft_p95_returning_s"] / base["ttft_p95_returning_s"], 3)
    line = {"git": head["git"], "cpu": head["cpu"], "time": head["time"], "bench": "kv_tiers", "tenants": args.tenants,
            "preamble_tokens": args.preamble, "rounds": args.rounds, "pool_tokens": args.pool,
            "preambles_over_pool": round(args.tenants * args.preamble / args.pool, 2),
            "concurrency": args.concurrency, "max_tokens": args.max_tokens, "configs": results}
    if args.restart:
        line["restart"] = restart_check(args)
    print(json.dumps(line))


if __name__ == "__main__":
    main()
