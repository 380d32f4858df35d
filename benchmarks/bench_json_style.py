"""JSON output style against what the prompt shows: which ``json_style`` finishes most replies.

The extraction workload (``extraction_workload.py``: 32 documents, strict 7-field schema, greedy,
``max_tokens`` 160, all documents in one batch, in-process) for every pair of
few-shot answer style (``spaced``, ``compact``, ``none``; ``--few-shot-styles``) and engine
``json_style`` (``compact``, ``spaced``, ``flexible``, ``auto``; ``--json-styles``), one engine
per ``json_style`` on the same loaded weights, the prefix cache emptied before each run.

Prints one JSON line: per pair, the headline figures of ``figures.py`` (success among all
documents, goodput, cut by ``max_tokens``), forward passes per output token (jump-forward
tokens need no pass of their own), throughput and the first reply; ``--dump-replies`` writes
every reply.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import extraction_workload as wl
from bench_constrained import run
from machine import stamp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--docs", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--few-shot-styles", default="spaced,compact,none")
    ap.add_argument("--json-styles", default="compact,spaced,flexible,auto")
    ap.add_argument("--dump-replies", metavar="PATH", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from grammarserve import EngineConfig, SamplingParams
    from grammarserve.constraints import Constraint
    from grammarserve.engine.engine import Engine
    from grammarserve.models.loader import load_model

    base = EngineConfig(model=args.model, kv_cache_tokens=65536,
                        max_num_reqs=max(64, args.docs), max_batch_tokens=4096)
    loaded = load_model(base.model, dtype=base.torch_dtype, device=base.torch_device,
                        cache_dir=base.cache_dir, gguf_blocks=base.gguf_blocks)
    docs = wl.documents(args.docs)
    expected = [rec for _, rec in docs]
    params = [SamplingParams(max_tokens=args.max_tokens, temperature=0,
                             constraint=Constraint.json_schema(wl.SCHEMA))] * args.docs
    results: dict[str, dict[str, object]] = {}
    dump = open(args.dump_replies, "w") if args.dump_replies else None  # noqa: SIM115
    for json_style in args.json_styles.split(","):
        engine = Engine(dataclasses.replace(base, grammar_json_style=json_style), loaded=loaded)
        engine.grammar.compiler.compile_json_schema(wl.SCHEMA)  # outside the timed runs
        for shots in args.few_shot_styles.split(","):
            prompts = [engine.tokenizer.apply_chat_template(
                wl.messages(d, 6, shots), tokenize=False, add_generation_prompt=True)
                for d, _ in docs]
            r = run(engine, prompts, params, expected, True)
            replies = r.pop("_replies")
            key = f"{shots}/{json_style}"
            results[key] = {k: r[k] for k in (
                "success_pct", "goodput_valid_per_s", "cut_by_length", "valid_of_finished_pct",
                "tok_per_s", "output_tokens", "jump_forward_tokens", "field_accuracy_pct")}
            results[key]["forward_passes_per_output_token"] = round(
                r["forward_passes"] / r["output_tokens"], 3)
            results[key]["first_reply"] = replies[0]["text"]
            if dump:
                dump.writelines(json.dumps({"few_shot": shots, "json_style": json_style, **x})
                                + "\n" for x in replies)
            print(key, json.dumps(results[key]), file=sys.stderr, flush=True)
        del engine
    if dump:
        dump.close()
    print(json.dumps({**stamp(), "bench": "json_style", "docs": args.docs, "max_tokens": args.max_tokens,
                      "results": results}))


if __name__ == "__main__":
    main()
