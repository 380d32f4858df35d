"""The extraction workload through the engine alone, closed loop: where a step's time goes.

The same requests as ``bench_serving.py --workload extraction`` (shared ~1,150-token instruction
prompt + one document, 7-field json_schema, greedy, max_tokens 160), submitted in-process at a
fixed concurrency (a new request as soon as one finishes), with no HTTP in between. Every forward
is timed and classified, so the profile of issue 9's workload can be read without a server:
pure decode steps (one token per request), decode steps carrying jump-forward spans, steps that
also prefill a new request, and the cold first prefill. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import extraction_workload as wl
from machine import stamp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1, help="requests run (untimed) first")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from grammarserve import EngineConfig, SamplingParams
    from grammarserve.constraints import Constraint
    from grammarserve.engine.engine import Engine

    eng = Engine(EngineConfig(model="default", kv_cache_tokens=65536))
    tok = eng.tokenizer
    docs = wl.documents(args.requests + args.warmup)
    prompts = [tok.apply_chat_template(wl.messages(d), tokenize=False, add_generation_prompt=True)
               for d, _ in docs]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0,
                            constraint=Constraint.json_schema(wl.SCHEMA, strict=True))
    for i in range(args.warmup):
        eng.add_request(f"w{i}", prompts[args.requests + i], params)
    while eng.has_unfinished():
        eng.step()

    steps: list[tuple[int, int, float]] = []  # (rows, longest extend, seconds) per forward
    forward = eng.runner.forward

    def timed(entries: Any) -> Any:
        t = time.perf_counter()
        out = forward(entries)
        steps.append((len(entries), max(len(e.token_ids) for e in entries),
                      time.perf_counter() - t))
        return out

    eng.runner.forward = timed  # type: ignore[method-assign]
    s0 = eng.stats()
    sent: dict[str, float] = {}
    ttft: dict[str, float] = {}
    nxt = 0

    def submit() -> None:
        nonlocal nxt
        rid = f"r{nxt}"
        eng.add_request(rid, prompts[nxt], params)
        sent[rid] = time.perf_counter()
        nxt += 1

    t0 = time.perf_counter()
    for _ in range(min(args.concurrency, args.requests)):
        submit()
    while eng.has_unfinished():
        for o in eng.step():
            if o.token_ids and o.request_id not in ttft:
                ttft[o.request_id] = time.perf_counter() - sent[o.request_id]
            if o.finished and nxt < args.requests:
                submit()
    wall = time.perf_counter() - t0
    s1 = eng.stats()

    def bucket(pred: Any) -> dict[str, Any]:
        xs = [t for rows, ext, t in steps if pred(rows, ext)]
        return {"steps": len(xs), "median_ms": round(1000 * statistics.median(xs), 1) if xs
                else None, "total_s": round(sum(xs), 2)}

    full = args.concurrency
    tt = sorted(ttft.values())
    print(json.dumps({
        **stamp(), "bench": "engine_loop", "requests": args.requests, "concurrency": args.concurrency,
        "warmup": args.warmup, "wall_s": round(wall, 2),
        "requests_per_s": round(args.requests / wall, 3),
        "forward_passes": len(steps), "forward_s": round(sum(t for *_, t in steps), 2),
        "ttft_p50": round(tt[len(tt) // 2], 3), "ttft_p95": round(tt[int(0.95 * (len(tt) - 1))], 3),
        "generated_tokens": s1.generated_tokens - s0.generated_tokens,
        "jump_forward_tokens": s1.jump_forward_tokens - s0.jump_forward_tokens,
        "decode_1_token": bucket(lambda rows, ext: rows == full and ext == 1),
        "decode_with_jump_forward": bucket(lambda rows, ext: rows == full and 1 < ext <= 16),
        "with_prefill": bucket(lambda rows, ext: ext > 16),
        "partial_batch": bucket(lambda rows, ext: rows < full and ext <= 16),
    }))


if __name__ == "__main__":
    main()
