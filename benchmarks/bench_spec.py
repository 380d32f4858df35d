"""Speculative decoding (issue 35), side by side in one run: our server with its defaults
(speculation on, adaptive) against the same server with ``--num-speculative-tokens 0``, and
optionally a peer (``--peer NAME=URL``, e.g. llama-server), request by request interleaved.

Parts (``--parts``, default all):
- ``single``: one request at a time, greedy, streamed, through the OpenAI SDK:
  ``extraction`` (``extraction_workload.py`` documents, the strict contact schema, few-shot
  spaced and zero-shot), ``chat`` (plain questions, no constraint, ``max_tokens`` 200) and
  ``copy`` (summaries that quote the document). Per side: output tokens/s over the whole
  request (TTFT included), decode tokens/s (after the first token), valid replies, field
  accuracy, and how many replies equal the no-speculation reply token for token.
- ``rows``: ``--rows`` concurrent requests (chat and extraction mixed): total output tokens/s.
- ``batch``: ``grammarserve batch`` on ``--batch-lines`` extraction lines (zero-shot, so the
  structure comes from earlier replies, not from examples), each side its own process: valid
  lines/s.

Prints one JSON line (git revision, CPU, time); each side's ``/metrics`` drafted/accepted
tokens are in it.

    .venv/bin/python benchmarks/bench_spec.py
    .venv/bin/python benchmarks/bench_spec.py --parts single --peer llama=http://127.0.0.1:8200/v1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jsonschema
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_batch
import extraction_workload as wl
import tools_workload as tw
from bench_serving import one
from machine import cpu_name, revision
from serverproc import ServerProcess, metrics

OURS = ("spec", "nospec")
FORMAT = {"type": "json_schema",
          "json_schema": {"name": "contact", "schema": wl.SCHEMA, "strict": True}}
COPY = ("Quote the sentence of this text that gives the e-mail address, word for word, then "
        "the one that gives the city.\n\n")


def requests(n: int) -> dict[str, list[dict[str, Any]]]:
    docs = wl.documents(n, seed=7)
    ex = [{"messages": wl.messages(d, style=style), "response_format": FORMAT,
           "max_tokens": 160, "_expected": rec}
          for style in ("spaced", "none") for d, rec in docs[: n // 2]]
    chat = [{"messages": [{"role": "user", "content": tw.CHAT[i % len(tw.CHAT)]}],
             "max_tokens": 200} for i in range(n)]
    copy = [{"messages": [{"role": "user", "content": COPY + d}], "max_tokens": 120}
            for d, _ in docs[:n]]
    return {"extraction": ex, "chat": chat, "copy": copy}


def _valid(kw: dict[str, Any], r: dict[str, Any]) -> tuple[bool, int]:
    if "_expected" not in kw:
        return bool(r["text"]) and r["finish"] == "stop", 0
    try:
        obj = json.loads(r["text"])
        jsonschema.validate(obj, wl.SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False, 0
    return r["finish"] == "stop", sum(obj.get(k) == v for k, v in kw["_expected"].items())


async def single(urls: dict[str, str], reqs: list[dict[str, Any]]) -> dict[str, Any]:
    clients = {k: openai.AsyncOpenAI(base_url=u, api_key="x", max_retries=0)
               for k, u in urls.items()}
    res: dict[str, list[dict[str, Any]]] = {k: [] for k in urls}
    for kw in reqs:
        for side, client in clients.items():
            res[side].append(await one(client, "default", {**kw, "temperature": 0.0}))
    out: dict[str, Any] = {}
    for side, rs in res.items():
        toks = sum(r["completion_tokens"] for r in rs)
        lat = sum(r["latency"] for r in rs)
        dec = sum(r["latency"] - (r["ttft"] or 0) for r in rs)
        checks = [_valid(kw, r) for kw, r in zip(reqs, rs)]
        fields = len(wl.SCHEMA["required"]) * sum("_expected" in kw for kw in reqs)
        out[side] = {
            "requests": len(rs), "output_tokens": toks,
            "tokens_per_s": round(toks / lat, 1),
            "decode_tokens_per_s": round(sum(max(r["completion_tokens"] - 1, 0) for r in rs)
                                         / max(dec, 1e-9), 1),
            "valid": sum(v for v, _ in checks),
            "field_accuracy_pct": round(100 * sum(c for _, c in checks) / fields, 1)
            if fields else None,
            "cut_by_length": sum(r["finish"] == "length" for r in rs),
            "same_text_as_nospec": sum(a["text"] == b["text"]
                                       for a, b in zip(rs, res["nospec"])),
            "ttft_s_median": sorted(r["ttft"] or 0 for r in rs)[len(rs) // 2]}
    for side in out:
        out[side]["vs_nospec"] = round(out[side]["tokens_per_s"]
                                       / out["nospec"]["tokens_per_s"], 2)
    return out


async def rows(urls: dict[str, str], reqs: list[dict[str, Any]], n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for side in OURS:  # NOTE: one side at a time (each would take the cores alone)
        client = openai.AsyncOpenAI(base_url=urls[side], api_key="x", max_retries=0)
        batch = (reqs * ((n // len(reqs)) + 1))[:n]
        t0 = time.perf_counter()
        rs = await asyncio.gather(*(one(client, "default", {**kw, "temperature": 0.0})
                                    for kw in batch))
        wall = time.perf_counter() - t0
        toks = sum(r["completion_tokens"] for r in rs)
        out[side] = {"requests": n, "output_tokens": toks, "wall_s": round(wall, 2),
                     "tokens_per_s": round(toks / wall, 1)}
    out["spec_vs_nospec"] = round(out["spec"]["tokens_per_s"] / out["nospec"]["tokens_per_s"], 3)
    return out


def batch(lines: int, tmp: Path, threads: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for side, k in (("nospec", 0), ("spec", 8)):
        folder = tmp / side
        folder.mkdir()
        inp = folder / "in.jsonl"
        expected = bench_batch.write_input(inp, lines, 0, 200, style="none")
        args = argparse.Namespace(kv_cache_tokens=65536, max_num_reqs=64, max_batch_tokens=2048,
                                  threads=threads, dump_replies=None)
        out[side] = run_cli_with(inp, expected, args, k)
    out["spec_vs_nospec_goodput"] = round(out["spec"]["goodput_valid_per_s"]
                                          / max(out["nospec"]["goodput_valid_per_s"], 1e-9), 2)
    return out


def run_cli_with(inp: Path, expected: list[dict[str, Any]], args: argparse.Namespace,
                 k: int) -> dict[str, Any]:
    """``bench_batch.run_cli`` with ``--num-speculative-tokens k`` added to its command."""
    real = bench_batch.subprocess.run

    def run(cmd: list[str], **kw: Any) -> Any:
        return real([*cmd, "--num-speculative-tokens", str(k)], **kw)

    bench_batch.subprocess.run = run  # type: ignore[assignment]
    try:
        return bench_batch.run_cli(inp, expected, args)
    finally:
        bench_batch.subprocess.run = real


def spec_metrics(url: str) -> dict[str, float]:
    m = metrics(url.removesuffix("/v1"))
    return {k.removeprefix("grammarserve_"): v for k, v in m.items()
            if k.startswith(("grammarserve_spec_", "grammarserve_tokens_per_forward"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="single,rows,batch")
    ap.add_argument("--requests", type=int, default=8, help="per single-stream workload")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--batch-lines", type=int, default=64)
    ap.add_argument("--peer", action="append", default=[], help="NAME=URL (single part only)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    result: dict[str, Any] = {"bench": "spec", "git": revision(), "cpu": cpu_name(),
                              "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    with tempfile.TemporaryDirectory() as tmp:
        servers = {side: ServerProcess(Path(tmp) / f"{side}.log", "--num-threads",
                                       str(args.threads), "--kv-cache-tokens", "65536",
                                       *(() if side == "spec" else
                                         ("--num-speculative-tokens", "0")))
                   for side in OURS}
        if parts & {"single", "rows"}:
            for s in servers.values():
                s.start()
            urls = {side: s.url + "/v1" for side, s in servers.items()}
            peers = dict(p.split("=", 1) for p in args.peer)
            try:
                reqs = requests(args.requests)
                if "single" in parts:
                    result["single"] = {name: asyncio.run(single({**urls, **peers}, rs))
                                        for name, rs in reqs.items()}
                if "rows" in parts:
                    mixed = reqs["chat"] + reqs["extraction"]
                    result["rows"] = asyncio.run(rows(urls, mixed, args.rows))
                result["metrics"] = {side: spec_metrics(u) for side, u in urls.items()}
            finally:
                for s in servers.values():
                    s.stop()
        if "batch" in parts:
            result["batch"] = batch(args.batch_lines, Path(tmp), args.threads)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
