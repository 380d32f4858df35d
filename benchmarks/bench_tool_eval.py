"""Function-calling accuracy and truncation on the BFCL evaluation set (``data/tool_eval.jsonl``).

Runs every question against an OpenAI-compatible server through the official SDK (greedy,
``tool_choice`` ``"required"`` by default, parallel calls allowed, ``max_tokens`` 200) and prints
one JSON line:

- ``n``; ``exact_match_pct``: replies whose calls match BFCL's expected calls (``tool_eval.py``'s
  scorer: BFCL's AST-checker rules) among all questions, and ``by_category``
- ``cut_by_length_pct``: replies with finish_reason ``length``
- ``valid_pct``: replies not cut, with at least one call, every call to a known tool with
  arguments that validate against its parameters
- ``goodput_valid_per_s``: valid replies per second of wall time (and the other headline
  figures of ``figures.py``); ``dup_replies``: replies holding two identical calls;
  ``prompt_tokens`` / ``completion_tokens``: sums over the replies

    .venv/bin/python benchmarks/bench_tool_eval.py --serve ""            # grammarserve, defaults
    .venv/bin/python benchmarks/bench_tool_eval.py --serve "--tool-call-format hermes"
    .venv/bin/python benchmarks/bench_tool_eval.py --base-url http://127.0.0.1:8000/v1 --label vllm

``--serve ARGS`` starts ``grammarserve serve --model default`` with ARGS on a free port and stops
it at the end; ``--base-url`` uses a running server. ``--dump PATH`` writes each reply as JSON
lines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import openai
from bench_serving import start_server, stop_server
from figures import success_figures
from machine import stamp
from tool_eval import check_calls, parse_calls

DATA = Path(__file__).resolve().parent / "data" / "tool_eval.jsonl"


def load(path: Path, limit: int | None) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows[:limit] if limit else rows


def request(row: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    tools = row["tools"]
    if args.strict_tools:
        tools = [{**t, "function": {**t["function"], "strict": True}} for t in tools]
    kw: dict[str, Any] = {"messages": row["messages"], "tools": tools,
                          "tool_choice": args.tool_choice, "temperature": 0.0,
                          "max_tokens": args.max_tokens}
    if args.no_parallel:
        kw["parallel_tool_calls"] = False
    return kw


async def ask(client: openai.AsyncOpenAI, model: str, kw: dict[str, Any], stream: bool
              ) -> dict[str, Any]:
    """``{"finish", "content", "tool_calls": [{"name", "arguments"}], "tokens",
    "prompt_tokens"}``."""
    if not stream:
        r = await client.chat.completions.create(model=model, **kw)
        ch = r.choices[0]
        calls = [{"name": c.function.name, "arguments": c.function.arguments}
                 for c in ch.message.tool_calls or []]
        return {"finish": ch.finish_reason, "content": ch.message.content, "tool_calls": calls,
                "tokens": r.usage.completion_tokens if r.usage else None,
                "prompt_tokens": r.usage.prompt_tokens if r.usage else None}
    content, finish, tokens, prompt_tokens = "", None, None, None
    calls_by_index: dict[int, dict[str, str]] = {}
    async for chunk in await client.chat.completions.create(
            model=model, stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None:
            tokens, prompt_tokens = chunk.usage.completion_tokens, chunk.usage.prompt_tokens
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for d in ch.delta.tool_calls or []:
                call = calls_by_index.setdefault(d.index, {"name": "", "arguments": ""})
                if d.function is not None:
                    call["name"] += d.function.name or ""
                    call["arguments"] += d.function.arguments or ""
            finish = ch.finish_reason or finish
    calls = [calls_by_index[i] for i in sorted(calls_by_index)]
    return {"finish": finish, "content": content or None, "tool_calls": calls, "tokens": tokens,
            "prompt_tokens": prompt_tokens}


def judge(row: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
    """Exact match, validity and duplicates of one reply."""
    calls = parse_calls([{"function": c} for c in reply["tool_calls"]])
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in row["tools"]}
    valid = (reply["finish"] != "length" and calls is not None and bool(calls)
             and all(n in schemas and jsonschema.Draft202012Validator(schemas[n]).is_valid(a)
                     for n, a in calls))
    error = "arguments are not JSON" if calls is None else check_calls(
        row["functions"], calls, row["ground_truth"], row["category"])
    texts = [json.dumps(c, sort_keys=True) for c in reply["tool_calls"]]
    return {"exact": error is None and reply["finish"] != "length", "valid": valid,
            "error": error, "dup": len(set(texts)) < len(texts)}


async def run(base_url: str, model: str | None, rows: list[dict[str, Any]],
              args: argparse.Namespace) -> tuple[list[dict[str, Any]], float, str]:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=2,
                                timeout=args.timeout)
    if model is None:
        model = (await client.models.list()).data[0].id
    sem = asyncio.Semaphore(args.concurrency)

    async def one(row: dict[str, Any]) -> dict[str, Any]:
        async with sem:
            try:
                reply = await ask(client, model, request(row, args), args.stream)
            except Exception as e:  # noqa: BLE001 - a failed request is a failed question
                reply = {"finish": "error", "content": f"{type(e).__name__}: {e}",
                         "tool_calls": [], "tokens": None, "prompt_tokens": None}
        return {"id": row["id"], "category": row["category"], **reply, **judge(row, reply)}

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(r) for r in rows))
    wall = time.perf_counter() - t0
    await client.close()
    return list(results), wall, model


def summarize(results: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    n = len(results)
    cut = sum(r["finish"] == "length" for r in results)
    errors = sum(r["finish"] == "error" for r in results)
    valid = sum(r["valid"] for r in results)
    exact = sum(r["exact"] for r in results)
    cats: dict[str, list[bool]] = {}
    for r in results:
        cats.setdefault(r["category"], []).append(r["exact"])
    tokens = [r["tokens"] for r in results if r["tokens"] is not None]
    prompt_tokens = [r["prompt_tokens"] for r in results if r["prompt_tokens"] is not None]

    def pct(k: int) -> float:
        return round(100.0 * k / n, 1) if n else 0.0

    return {"n": n, "exact_match_pct": pct(exact), "cut_by_length_pct": pct(cut),
            "valid_pct": pct(valid), "goodput_valid_per_s": round(valid / wall, 4),
            "exact_per_s": round(exact / wall, 4),
            "by_category": {c: f"{sum(v)}/{len(v)}" for c, v in cats.items()},
            "dup_replies": sum(r["dup"] for r in results), "errors": errors,
            "completion_tokens": sum(tokens), "prompt_tokens": sum(prompt_tokens),
            "wall_s": round(wall, 2),
            **success_figures(n, valid, n - cut - errors, cut, wall)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--base-url", help="a running OpenAI-compatible server (…/v1)")
    where.add_argument("--serve", metavar="ARGS",
                       help="start grammarserve with these extra arguments ('' for defaults)")
    ap.add_argument("--model", default=None, help="model name (default: the first listed)")
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--limit", type=int, default=None, help="first N questions only")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--tool-choice", default="required", choices=["required", "auto"])
    ap.add_argument("--strict-tools", action="store_true", help="'strict': true on every tool")
    ap.add_argument("--no-parallel", action="store_true", help="parallel_tool_calls=false")
    ap.add_argument("--stream", action="store_true", help="stream the replies")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--label", default=None)
    ap.add_argument("--dump", default=None, help="write each reply (JSON lines) here")
    args = ap.parse_args()
    rows = load(args.data, args.limit)
    proc = None
    base_url = args.base_url
    if args.serve is not None:
        proc, base_url, _ = start_server(shlex.split(args.serve))
    try:
        results, wall, model = asyncio.run(run(base_url, args.model, rows, args))
    finally:
        if proc is not None:
            stop_server(proc)
    if args.dump:
        with open(args.dump, "w") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in results)
    out = {"bench": "tool_eval", "server": args.label or ("grammarserve " + args.serve
                                                          if args.serve is not None else base_url),
           "model": model, "tool_choice": args.tool_choice, "strict_tools": args.strict_tools,
           "parallel": not args.no_parallel, "stream": args.stream, "max_tokens": args.max_tokens,
           "concurrency": args.concurrency, **summarize(results, wall)}
    print(json.dumps({**stamp(), **out}), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
