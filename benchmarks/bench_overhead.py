"""Engine overhead: the engine's decode step against the model's bare forward on the same batch.

B requests decode together (greedy, EOS ignored, prompts of P random tokens). Every step is timed
three ways at once: the whole ``Engine.step()``, the model runner's forward inside it (batch
building + model), and the model call alone. What is left (scheduling, mask fill wait, sampling,
detokenization, outputs) is the engine's overhead. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch
from machine import stamp


def measure(engine: Any, batch: int, prompt_len: int, steps: int,
            constraint: Any = None) -> dict[str, Any]:
    from grammarserve import SamplingParams

    runner = engine.runner
    timings = {"model": 0.0, "runner": 0.0}
    model_call, runner_forward = runner.model, runner.forward

    def timed_model(*a: Any) -> Any:
        t = time.perf_counter()
        out = model_call(*a)
        timings["model"] += time.perf_counter() - t
        return out

    def timed_forward(entries: Any) -> Any:
        t = time.perf_counter()
        out = runner_forward(entries)
        timings["runner"] += time.perf_counter() - t
        return out

    gen = torch.Generator().manual_seed(0)
    vocab = engine.loaded.config.vocab_size
    params = SamplingParams(max_tokens=steps + 8, temperature=0, ignore_eos=True,
                            constraint=constraint)
    for i in range(batch):
        ids = torch.randint(100, vocab, (prompt_len,), generator=gen).tolist()
        engine.add_request(f"b{i}", ids, params)
    while any(r.num_computed < len(r.prompt_ids) for r in engine.requests.values()) or \
            len(engine.scheduler.running) < batch:
        engine.step()
    for _ in range(3):  # warm-up decode steps
        engine.step()
    runner.model, runner.forward = timed_model, timed_forward
    step_times, model_times, runner_times = [], [], []
    try:
        for _ in range(steps):
            m0, r0 = timings["model"], timings["runner"]
            t = time.perf_counter()
            engine.step()
            step_times.append(time.perf_counter() - t)
            model_times.append(timings["model"] - m0)
            runner_times.append(timings["runner"] - r0)
    finally:
        runner.model, runner.forward = model_call, runner_forward
    for rid in list(engine.requests):
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()
    step, model, run = (statistics.median(x) * 1000 for x in (step_times, model_times,
                                                             runner_times))
    return {"batch": batch, "step_ms": round(step, 2), "runner_forward_ms": round(run, 2),
            "model_ms": round(model, 2), "step_over_model": round(step / model, 3),
            "step_over_runner_forward": round(step / run, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from grammarserve import Constraint, EngineConfig
    from grammarserve.engine.engine import Engine

    engine = Engine(EngineConfig(model=args.model, kv_cache_tokens=32768))
    # NOTE: allows any text and can only end after 1000 "x": nothing is forced, nothing ends.
    free_text = Constraint.regex(r"(?s:.*)x{1000}")
    rows = []
    for b in (int(x) for x in args.batches.split(",")):
        rows.append({"constrained": False, **measure(engine, b, args.prompt_len, args.steps)})
        rows.append({"constrained": True, **measure(engine, b, args.prompt_len, args.steps,
                                                    free_text)})
    print(json.dumps({**stamp(), "bench": "overhead", "prompt_len": args.prompt_len, "steps": args.steps,
                      "threads": args.threads, "results": rows}))


if __name__ == "__main__":
    main()
