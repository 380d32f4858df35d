"""Constrained decoding cost and jump-forward gain on a JSON-extraction workload.

32 documents behind a shared instruction prompt (schema + few-shot examples), a 7-field schema,
greedy, all documents in one batch. Three runs on one engine, side by side:
(a) unconstrained, (b) constrained without jump-forward, (c) constrained with jump-forward.
The prefix cache is emptied before each run so all three prefill the same tokens.

Prints one JSON line per run set. Each run leads with the success figures of ``figures.py``,
measured among all documents: ``success_pct`` (valid replies that were not cut by ``max_tokens``),
``goodput_valid_per_s`` (valid replies per second), ``valid_of_finished_pct``, ``cut_by_length``;
then throughput, decode steps per output token (a request's sampled tokens / its output tokens:
jump-forward tokens need no step of their own), the mean time of a full-batch decode step, the
mask-fill time as a share of the step time (and the part the step waited for), the older
``valid_pct`` (valid JSON among all replies, cut or not) and field accuracy.

``--few-shot-style spaced|compact|indented|none`` picks how the prompt's worked examples are
written (``extraction_workload.py``); ``--dump-replies PATH`` writes every reply as JSONL;
``--cold-schema`` makes (c) the schema's first batch (compile cache emptied before it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import extraction_workload as wl
from figures import success_figures
from machine import stamp


def run(engine: Any, prompts: list[str], params: list[Any],
        expected: list[dict[str, Any]], constrained: bool) -> dict[str, Any]:
    if engine.cache is not None:
        engine.cache.reset()
    s0 = engine.stats()
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(f"r{i}", p, sp)
    outs: dict[str, Any] = {}
    full_steps: list[float] = []
    t0 = time.perf_counter()
    while engine.has_unfinished():
        running = engine.scheduler.running
        full = len(running) == len(prompts) and all(
            r.num_computed >= len(r.prompt_ids) for r in running)
        ts = time.perf_counter()
        for o in engine.step():
            if o.finished:
                outs[o.request_id] = o
        if full:
            full_steps.append(time.perf_counter() - ts)
    wall = time.perf_counter() - t0
    s1 = engine.stats()
    ordered = [outs[f"r{i}"] for i in range(len(prompts))]
    n_out = sum(len(o.token_ids) for o in ordered)
    forced = s1.jump_forward_tokens - s0.jump_forward_tokens
    valid = correct = 0
    oks: list[bool] = []
    for o, exp in zip(ordered, expected):
        oks.append(False)
        try:
            obj = json.loads(o.text)
            jsonschema.validate(obj, wl.SCHEMA)
        except (ValueError, jsonschema.ValidationError):
            continue
        valid += 1
        correct += sum(obj.get(k) == v for k, v in exp.items())
        oks[-1] = o.finish_reason != "length"
    cut = sum(o.finish_reason == "length" for o in ordered)
    passes = s1.forward_passes - s0.forward_passes
    return {
        "constrained": constrained,
        **success_figures(len(ordered), sum(oks), len(ordered) - cut, cut, wall),
        "wall_s": round(wall, 2),
        "output_tokens": n_out, "tok_per_s": round(n_out / wall, 2),
        "forward_passes": passes, "jump_forward_tokens": forced,
        "decode_steps_per_output_token": round((n_out - forced) / n_out, 3),
        "full_batch_step_ms": round(1000 * statistics.mean(full_steps), 1) if full_steps else None,
        "full_batch_steps": len(full_steps),
        "mask_fill_share": round((s1.mask_fill_s - s0.mask_fill_s) / wall, 4),
        "mask_wait_share": round((s1.mask_wait_s - s0.mask_wait_s) / wall, 4),
        "valid_pct": round(100 * valid / len(ordered), 1),
        "field_accuracy_pct": round(100 * correct / (7 * len(ordered)), 1),
        "finish_reasons": sorted({o.finish_reason for o in ordered}),
        "_replies": [{"i": i, "finish_reason": o.finish_reason, "valid": ok, "text": o.text,
                      "output_tokens": len(o.token_ids)}
                     for i, (o, ok) in enumerate(zip(ordered, oks))],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--docs", type=int, default=32)
    ap.add_argument("--shots", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--few-shot-style", choices=wl.FEW_SHOT_STYLES, default="spaced",
                    help="the few-shot answers as json.dumps defaults (spaced), compact, "
                         "indent=2, or no examples")
    ap.add_argument("--cold-schema", action="store_true",
                    help="run (c) as the schema's first batch: its compile cache is emptied "
                         "first, so the compile and the first requests' grammar are timed")
    ap.add_argument("--dump-replies", metavar="PATH", default=None,
                    help="write each reply (run, text, finish_reason, valid) as JSONL")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from grammarserve import EngineConfig, SamplingParams
    from grammarserve.constraints import Constraint
    from grammarserve.engine.engine import Engine

    engine = Engine(EngineConfig(model=args.model, kv_cache_tokens=65536,
                                 max_num_reqs=max(64, args.docs), max_batch_tokens=4096))
    tok = engine.tokenizer
    docs = wl.documents(args.docs)
    prompts = [tok.apply_chat_template(wl.messages(d, args.shots, args.few_shot_style),
                                       tokenize=False,
                                       add_generation_prompt=True) for d, _ in docs]
    expected = [rec for _, rec in docs]
    schema = Constraint.json_schema(wl.SCHEMA)
    mk = SamplingParams
    runs = {
        "a_unconstrained": [mk(max_tokens=args.max_tokens, temperature=0)] * args.docs,
        "b_constrained": [mk(max_tokens=args.max_tokens, temperature=0, constraint=schema,
                             jump_forward=False)] * args.docs,
        "c_constrained_jump_forward": [mk(max_tokens=args.max_tokens, temperature=0,
                                          constraint=schema)] * args.docs,
    }
    engine.grammar.compiler.compile_json_schema(wl.SCHEMA)  # compile outside the timed runs
    res = {}
    for name, p in runs.items():
        if args.cold_schema and name.startswith("c_"):
            engine.grammar.compiler.clear_caches()
        res[name] = run(engine, prompts, p, expected, name != "a_unconstrained")
    if args.dump_replies:
        with open(args.dump_replies, "w") as f:
            for name, r in res.items():
                f.writelines(json.dumps({"run": name, **line}) + "\n" for line in r["_replies"])
    for r in res.values():
        del r["_replies"]
    a, b, c = res.values()
    summary = {
        "prompt_tokens_each": len(tok.encode(prompts[0])), "docs": args.docs,
        "few_shot_style": args.few_shot_style, "max_tokens": args.max_tokens,
        "success_pct_c": c["success_pct"], "goodput_valid_per_s_c": c["goodput_valid_per_s"],
        "cut_by_length_c": c["cut_by_length"],
        "step_time_b_over_a": (round(b["full_batch_step_ms"] / a["full_batch_step_ms"], 3)
                               if a["full_batch_step_ms"] and b["full_batch_step_ms"] else None),
        "decode_steps_per_token_b_over_c": round(
            b["decode_steps_per_output_token"] / c["decode_steps_per_output_token"], 2),
        "throughput_c_over_a": round(c["tok_per_s"] / a["tok_per_s"], 2),
        "throughput_c_over_b": round(c["tok_per_s"] / b["tok_per_s"], 2),
    }
    print(json.dumps({**stamp(), "bench": "constrained", **summary, **res}))


if __name__ == "__main__":
    main()
