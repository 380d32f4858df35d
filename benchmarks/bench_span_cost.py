"""What one forward costs when one request feeds n tokens at once (a speculative draft's
verification) against n = 1, at several context lengths: the model runner alone (the CPU
decode-stack kernel: int8 matmuls, fused attention over the row mirror, the LM head for every
fed position), medians of 12 repeats. This is the price of a draft token that speculation's
cost fit (``grammarserve/engine/spec/cost.py``) measures in the engine.

    .venv/bin/python benchmarks/bench_span_cost.py --threads 2

Prints one JSON line (git revision, CPU, time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import cpu_name, revision

from grammarserve.config import EngineConfig
from grammarserve.engine.engine import Engine
from grammarserve.engine.model_runner import BatchEntry


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--contexts", default="100,1000,3000")
    ap.add_argument("--spans", default="1,2,4,8,16")
    ap.add_argument("--repeat", type=int, default=12)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    eng = Engine(EngineConfig(device="cpu", kv_cache_tokens=16384, max_num_reqs=4,
                              num_speculative_tokens=0, adaptive_threads=False))
    runner = eng.runner
    spans = [int(n) for n in args.spans.split(",")]
    out: dict[str, dict[str, float]] = {}
    for ctx in (int(c) for c in args.contexts.split(",")):
        row = runner.req_to_token.alloc()
        slots = runner.pool.alloc(ctx + max(spans))
        runner.req_to_token.write(row, 0, slots)
        runner.forward([BatchEntry(row, 0, list(range(1000, 1000 + ctx)), seq_id=7)])
        ms: dict[str, float] = {}
        for n in spans:
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                runner.forward([BatchEntry(row, ctx, list(range(2000, 2000 + n)), seq_id=7,
                                           num_logits=n)])
                times.append(time.perf_counter() - t0)
            ms[str(n)] = round(1000 * statistics.median(times), 2)
        out[str(ctx)] = {"ms": ms, "vs_one": {n: round(v / ms["1"], 2) for n, v in ms.items()}}
        runner.pool.free(slots)
        runner.req_to_token.free(row)
    print(json.dumps({"bench": "span_cost", "git": revision(), "cpu": cpu_name(),
                      "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "threads": args.threads,
                      "contexts": out}))


if __name__ == "__main__":
    main()
