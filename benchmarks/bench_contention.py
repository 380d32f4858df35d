"""Decode throughput on a quiet machine and beside busy processes, with the thread count fixed at
``--threads`` and with the engine's ThreadTuner (``adaptive_threads``), side by side in one run.

Every core gets one busy-looping process for the busy runs (as when the server shares its host
with other work). Each run decodes ``--rows`` requests of ``--context`` random prompt tokens for
``--steps`` steps (greedy, ``ignore_eos``) after their prefill, and reports decode tokens/s and
the slowest step. Prints one JSON line::

    .venv/bin/python benchmarks/bench_contention.py [--rows 8] [--context 512] [--steps 24]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from typing import Any

import torch
from machine import stamp


def _spin() -> None:
    while True:
        pass


def _decode(llm: Any, rows: int, ctx: int, steps: int, tag: str) -> dict[str, float]:
    from grammarserve import SamplingParams

    eng = llm.engine
    gen = torch.Generator().manual_seed(rows)
    for i in range(rows):
        ids = torch.randint(100, 40000, (ctx,), generator=gen).tolist()
        eng.add_request(f"{tag}-{i}", ids, SamplingParams(max_tokens=steps + 4, temperature=0,
                                                          ignore_eos=True))
    while eng.scheduler.waiting or any(r.num_computed < len(r.prompt_ids)
                                       for r in eng.scheduler.running):
        eng.step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        eng.step()
        times.append(time.perf_counter() - t0)
    while eng.has_unfinished():
        eng.step()
    return {"tok_s": round(rows * steps / sum(times), 1),
            "slowest_step_ms": round(1e3 * max(times), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from grammarserve import LLM

    tokens = args.rows * (args.context + args.steps + 64)
    llms = {name: LLM("default", device="cpu", max_num_reqs=args.rows, num_threads=args.threads,
                      enable_prefix_cache=False, kv_cache_tokens=tokens + 4096,
                      decode_mirror_tokens=tokens, adaptive_threads=adaptive)
            for name, adaptive in (("fixed", False), ("adaptive", True))}
    out: dict[str, Any] = {"bench": "contention", "rows": args.rows, "context": args.context,
                           "threads": args.threads, "busy_processes": os.cpu_count() or 2}
    for load in ("quiet", "busy"):
        spinners = []
        if load == "busy":
            spinners = [mp.Process(target=_spin, daemon=True) for _ in range(out["busy_processes"])]
            for p in spinners:
                p.start()
        try:
            for name, llm in llms.items():
                torch.set_num_threads(args.threads)  # the tuner of the other engine may have set 1
                out[f"{load}_{name}"] = _decode(llm, args.rows, args.context, args.steps,
                                                f"{load}-{name}")
                out[f"{load}_{name}"]["threads_now"] = torch.get_num_threads()
        finally:
            for p in spinners:
                p.kill()
    print(json.dumps({**stamp(), **out}))


if __name__ == "__main__":
    main()
