"""What new schemas cost the requests already decoding: the engine loop's iteration time (admit
new requests, then one step) while unconstrained rows decode, quiet and with one constrained
request of a not-yet-compiled schema arriving per iteration, side by side in one run.

The front end runs on the loop's thread (``add_request``) and the backend compiles on worker
threads, which share the cores with the decode (a step runs on one thread fewer while a
compile is in flight, see ``Engine.step``) and the GIL for their Python parts. The engine is
warmed up and its heap frozen first, as the engine process does. With ``--prepared`` the
constraints carry their front end's result, made beforehand by another compiler: what the
engine process receives from the server, which ran the front end to answer a bad schema
with a 400 (only the backend compile is then left to the engine). The schemas are those of
``schemas/realworld/`` (each compiled once, so every one is cold), in file order; the
constrained requests have a 2-token prompt and ``max_tokens=1``, so their own prefill is
negligible. The quiet iterations come first; the rows' contexts grow by a token an
iteration, so the compiles' iterations attend over up to ``schemas`` more tokens (a few ms
of the difference at 8 rows). Prints one JSON line::

    .venv/bin/python benchmarks/bench_compile_stall.py [--rows 8] [--context 256] [--limit 0]
        [--no-warm-up] [--prepared]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import stamp

REPO = Path(__file__).resolve().parents[1]


def _pcts(ms: list[float]) -> dict[str, float]:
    s = sorted(ms)
    return {"p50_ms": round(s[len(s) // 2], 1), "p90_ms": round(s[int(0.9 * len(s))], 1),
            "p99_ms": round(s[int(0.99 * len(s))], 1), "max_ms": round(s[-1], 1),
            "iterations": len(s)}


def _iterations(eng: Any, constraints: list[Any], count: int, tag: str
                ) -> tuple[list[float], list[float]]:
    """Time ``count`` loop iterations; before each, add the next constrained request (if any).
    Returns the iterations' times and the ``add_request`` part of them (the front end)."""
    from grammarserve import SamplingParams

    times, adds = [], []
    for i in range(count):
        start = time.perf_counter()
        if i < len(constraints):
            params = SamplingParams(max_tokens=1, temperature=0, constraint=constraints[i])
            eng.add_request(f"{tag}-c{i}", [28, 29], params)
            adds.append((time.perf_counter() - start) * 1e3)
        eng.step()
        times.append((time.perf_counter() - start) * 1e3)
    return times, adds


def _prepared(server: Any, constraint: Any) -> Any:
    """``constraint`` with its spec from ``server`` (unchanged if the front end refuses it)."""
    from grammarserve.errors import GrammarError

    kind, args, kwargs = constraint.compile_args()
    try:
        return replace(constraint, prepared=server.spec(kind, *args, **kwargs))
    except GrammarError:
        return constraint


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--limit", type=int, default=0, help="schemas to send (0 = all)")
    ap.add_argument("--no-warm-up", action="store_true",
                    help="leave the grammar backends to the first constrained request")
    ap.add_argument("--prepared", action="store_true",
                    help="constraints carry their front end's result, made beforehand by "
                         "another compiler, as the server process does for the engine's")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from grammarserve import LLM, SamplingParams
    from grammarserve.constraints import Constraint
    from grammarserve.engine.heap import freeze_startup_heap
    from grammarserve.fsm import GrammarCompiler
    from grammarserve.fsm.conformance import load_corpus

    schemas = [c.schema for c in load_corpus(REPO / "schemas" / "realworld")]
    schemas = schemas[:args.limit] if args.limit else schemas
    constraints = [Constraint.json_schema(x) for x in schemas]
    count = len(schemas)
    llm = LLM("default", device="cpu", max_num_reqs=args.rows + 4, enable_prefix_cache=False)
    eng = llm.engine
    if args.prepared:  # NOTE: the server's compiler, with the engine's options
        server = GrammarCompiler(eng.tokenizer, **eng.config.grammar_options,
                                 vocab_size=eng.grammar.compiler.vocab_size)
        constraints = [_prepared(server, c) for c in constraints]
    if not args.no_warm_up:
        eng.warm_up()  # NOTE: as the engine process does before serving (then freezes its heap)
    freeze_startup_heap()
    gen = torch.Generator().manual_seed(0)
    for i in range(args.rows):
        ids = torch.randint(100, 40000, (args.context,), generator=gen).tolist()
        eng.add_request(f"row-{i}", ids, SamplingParams(max_tokens=4 * count + 64,
                                                        temperature=0, ignore_eos=True))
    while eng.scheduler.waiting or any(r.num_computed < len(r.prompt_ids)
                                       for r in eng.scheduler.running):
        eng.step()
    out: dict[str, Any] = {"bench": "compile_stall", "rows": args.rows,
                           "context": args.context, "schemas": count,
                           "warmed_up": not args.no_warm_up, "prepared": args.prepared}
    # NOTE: quiet first: the rows' contexts grow by one token an iteration, so a quiet run
    # after the compiles would be slower for that alone
    out["quiet"] = _pcts(_iterations(eng, [], count, "q1")[0])
    times, adds = _iterations(eng, constraints, count, "c")
    out["with_compiles"] = _pcts(times)
    out["add_request"] = _pcts(adds)  # the part of those iterations spent in the front end
    print(json.dumps({**stamp(), **out}))


if __name__ == "__main__":
    main()
