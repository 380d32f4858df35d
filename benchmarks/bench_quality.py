"""The quality matrix (issue 32): schema shapes x prompt styles, side by side on several servers.

For every target (our server in one or more modes, started here; peers already running, given by
URL) every cell (shape, prompt style) sends ``--docs`` documents through
``/v1/chat/completions`` with ``response_format: json_schema`` (the shape's Pydantic-style
schema, not strict), greedy, ``--concurrency`` in flight. Per cell and target: finished-valid
among all requests (``finish_reason`` stop, parses, validates with ``jsonschema``), replies cut by
``max_tokens``, field accuracy against the truth (``quality_workload.field_scores``, over all
requests: a failed reply scores 0), output tokens, and goodput (finished-valid replies per second
of the target's wall time). Prints one JSON line (git revision, CPU, time, all cells); with
``--replies FILE`` every reply is written there (read them).

    .venv/bin/python benchmarks/bench_quality.py --ours default="" \\
        --ours old="--no-canonical-spans" --peer vllm=http://127.0.0.1:8100 --docs 4

``--ours NAME=ARGS`` starts ``grammarserve serve`` on the embedded model with ARGS (split on
spaces); ``--peer NAME=URL`` is a server already serving the same weights as model ``default``.
Targets run one after another, each alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_name, revision
from quality_workload import PROMPT_STYLES, SHAPES, field_scores, messages
from serverproc import ServerProcess, request


def _one(url: str, shape: str, style: str, doc: str, truth: dict[str, Any],
         max_tokens: int) -> dict[str, Any]:
    schema = SHAPES[shape].schema
    body = {"model": "default", "temperature": 0, "max_tokens": max_tokens,
            "messages": messages(SHAPES[shape], doc, style),
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": SHAPES[shape].schema["title"],
                                                "schema": schema}}}
    status, reply = request("POST", url + "/v1/chat/completions", body, timeout=600)
    out: dict[str, Any] = {"shape": shape, "style": style, "status": status}
    if status != 200:
        out.update(finish=None, valid=False, text=str(reply)[:300], tokens=0,
                   fields=field_scores(truth, None))
        return out
    choice = reply["choices"][0]
    text = choice["message"].get("content") or ""
    parsed: Any = None
    try:
        parsed = json.loads(text)
        jsonschema.validate(parsed, schema)
        valid = choice["finish_reason"] == "stop"
    except (ValueError, jsonschema.ValidationError):
        valid = False
    out.update(finish=choice["finish_reason"], valid=valid, text=text,
               tokens=reply["usage"]["completion_tokens"],
               fields=field_scores(truth, parsed if valid else None))
    return out


def run_target(url: str, args: argparse.Namespace) -> tuple[list[dict[str, Any]], float]:
    jobs = [(s, st, doc, truth) for s in args.shapes for st in args.styles
            for doc, truth in SHAPES[s].documents(args.docs, seed=args.seed)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        results = list(pool.map(lambda j: _one(url, *j, args.max_tokens), jobs))
    return results, time.perf_counter() - t0


def summarize(results: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    cells: dict[str, dict[str, Any]] = {}
    for r in results:
        c = cells.setdefault(f"{r['shape']}/{r['style']}",
                             {"n": 0, "valid": 0, "cut": 0, "errors": 0, "correct": 0,
                              "fields": 0, "tokens": 0})
        c["n"] += 1
        c["valid"] += r["valid"]
        c["cut"] += r["finish"] == "length"
        c["errors"] += r["status"] != 200
        c["correct"] += r["fields"][0]
        c["fields"] += r["fields"][1]
        c["tokens"] += r["tokens"]
    for c in cells.values():
        c["field_acc"] = round(c["correct"] / c["fields"], 4) if c["fields"] else 0.0
    n = len(results)
    valid = sum(r["valid"] for r in results)
    total = {"n": n, "valid": valid, "cut": sum(r["finish"] == "length" for r in results),
             "field_acc": round(sum(r["fields"][0] for r in results)
                                / max(1, sum(r["fields"][1] for r in results)), 4),
             "tokens": sum(r["tokens"] for r in results), "wall_s": round(wall, 1),
             "goodput_valid_per_s": round(valid / wall, 4)}
    return {"total": total, "cells": cells}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ours", action="append", default=[], metavar="NAME=ARGS")
    ap.add_argument("--peer", action="append", default=[], metavar="NAME=URL")
    ap.add_argument("--docs", type=int, default=4, help="documents per cell")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=320)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--styles", nargs="+", default=list(PROMPT_STYLES), choices=PROMPT_STYLES)
    ap.add_argument("--replies", type=Path, help="write every reply here (JSON lines)")
    args = ap.parse_args()
    targets: dict[str, Any] = {}
    replies = args.replies.open("w") if args.replies else None
    for spec in args.ours + args.peer:
        name, _, value = spec.partition("=")
        server = None
        if spec in args.ours:
            log = Path(tempfile.gettempdir()) / f"bench_quality_{name}.log"
            server = ServerProcess(log, *value.split())
            server.start()
            url = server.url
        else:
            url = value
        try:
            results, wall = run_target(url, args)
        finally:
            if server is not None:
                server.stop()
        targets[name] = {"args" if server else "url": value, **summarize(results, wall)}
        if replies:
            for r in results:
                replies.write(json.dumps({"target": name, **r}) + "\n")
        print(f"# {name}: {targets[name]['total']}", file=sys.stderr, flush=True)
    print(json.dumps({"bench": "quality_matrix", "git": revision(), "cpu": cpu_name(),
                      "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "docs": args.docs,
                      "max_tokens": args.max_tokens, "concurrency": args.concurrency,
                      "targets": targets}))


if __name__ == "__main__":
    main()
