"""Serving at the model sizes users run: a random-weight GGUF of a real shape
(``model_shapes.py``), started with the defaults, beside llama-server on the same file.

For each server (grammarserve, then llama-server when its binary is there; one at a time, so
neither shares the cores), each workload and each stream count: ``streams * --rounds`` requests,
``streams`` at a time, streamed through the official OpenAI SDK.

Workloads:
- ``plain``: unconstrained chat, ``ignore_eos`` (every reply is ``--max-tokens`` long);
- ``json``: ``response_format`` json_schema (an invoice: nested object, array of objects, enum,
  optional field), greedy;
- ``tools``: two tools, ``tool_choice="required"``, greedy.

Per cell: ``tok_s`` (completion tokens of the wave / its wall time, prefill included),
``decode_tok_s`` (median over requests of (tokens - 1) / (last token - first token): one
stream's decode rate), ``ttft_p50_s``, and for the constrained workloads ``finished_valid``
(finish_reason stop / tool_calls and the reply validates) among ``requests``. The weights are
random, so the values are arbitrary; the figures are speed and validity. Ratios: ours over
llama-server per cell, and each server's constrained over its unconstrained ``tok_s``. Per server:
its start-up time, memory plan line, and resident memory (the process and its children) when
healthy and at its peak during the cells.

``--ttft 512,2048,6000``: after the cells, time to first token of one chat request per length
(``max_tokens`` 1, greedy), each prompt that many tokens of distinct text (no prefix in common
with any other request, so no cache serves it); ``ttft`` maps the prompt tokens the server
counted (``usage.prompt_tokens``) to seconds, and ``ttft_over_llama`` the ratios.
Prints one JSON line.

    .venv/bin/python benchmarks/bench_shapes.py --shape smollm2-1.7b [--streams 1,8]
        [--workloads plain,json,tools] [--max-tokens 96] [--rounds 2] [--llama-server PATH]
        [--qtype Q4_1|Q8_0|Q4_K_M|...] [--gguf FILE] [--ttft 512,2048,6000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import jsonschema
import openai
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import stamp
from model_shapes import SHAPES, default_dir, make_gguf
from serverproc import GRAMMARSERVE, free_port, request

LLAMA_SERVER = Path("/work/peers/llama/build/bin/llama-server")
INVOICE = {
    "type": "object",
    "properties": {
        "number": {"type": "string"},
        "currency": {"enum": ["EUR", "USD", "GBP"]},
        "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "qty": {"type": "integer"},
                           "price": {"type": "number"}},
            "required": ["name", "qty", "price"], "additionalProperties": False}},
        "po": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["number", "currency", "items", "po"], "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"},
                                         "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"},
                                         "limit": {"type": "integer"}},
        "required": ["query"], "additionalProperties": False}}},
]
PROMPTS = {
    "plain": "Write a short story about a lighthouse keeper.",
    "json": "Extract the invoice: INV-0042, 3 chairs at 40.50 EUR, 1 table at 120 EUR, PO 7781.",
    "tools": "What is the weather in Lisbon in celsius?",
}


def _kwargs(workload: str, max_tokens: int) -> dict[str, Any]:
    kw: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0,
                          "messages": [{"role": "user", "content": PROMPTS[workload]}]}
    if workload == "plain":
        kw["extra_body"] = {"ignore_eos": True}
    elif workload == "json":
        kw["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "invoice", "schema": INVOICE, "strict": True}}
    else:
        kw.update(tools=TOOLS, tool_choice="required")
    return kw


def _valid(workload: str, finish: str | None, text: str, calls: dict[int, dict[str, str]]
           ) -> bool:
    try:
        if workload == "json":
            jsonschema.validate(json.loads(text), INVOICE)
            return finish == "stop"
        if workload == "tools":
            params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
            for call in calls.values():
                jsonschema.validate(json.loads(call["arguments"]), params[call["name"]])
            return finish == "tool_calls" and bool(calls)
    except (ValueError, KeyError, jsonschema.ValidationError):
        return False
    return True


async def _one(client: openai.AsyncOpenAI, workload: str, max_tokens: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    stamps: list[float] = []
    text, finish, usage = "", None, None
    calls: dict[int, dict[str, str]] = {}
    stream = await client.chat.completions.create(
        model="default", stream=True, stream_options={"include_usage": True},
        **_kwargs(workload, max_tokens))
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            d = choice.delta
            if d.content or d.tool_calls:
                stamps.append(time.perf_counter())
            text += d.content or ""
            for tc in d.tool_calls or []:
                call = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                call["name"] += (tc.function and tc.function.name) or ""
                call["arguments"] += (tc.function and tc.function.arguments) or ""
            finish = choice.finish_reason or finish
    tokens = usage.completion_tokens if usage is not None else len(stamps)
    span = stamps[-1] - stamps[0] if len(stamps) > 1 else 0.0
    return {"tokens": tokens, "ttft": (stamps[0] if stamps else time.perf_counter()) - t0,
            "decode": (tokens - 1) / span if span > 0 else None,
            "valid": _valid(workload, finish, text, calls), "finish": finish}


async def _cell(url: str, workload: str, streams: int, rounds: int, max_tokens: int
                ) -> dict[str, Any]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", timeout=1800)
    sem = asyncio.Semaphore(streams)

    async def limited() -> dict[str, Any]:
        async with sem:
            return await _one(client, workload, max_tokens)

    t0 = time.perf_counter()
    outs = await asyncio.gather(*(limited() for _ in range(streams * rounds)))
    wall = time.perf_counter() - t0
    decode = [o["decode"] for o in outs if o["decode"] is not None]
    return {"requests": len(outs), "tok_s": round(sum(o["tokens"] for o in outs) / wall, 2),
            "decode_tok_s": round(statistics.median(decode), 2) if decode else None,
            "ttft_p50_s": round(statistics.median(o["ttft"] for o in outs), 2),
            "tokens": sum(o["tokens"] for o in outs),
            "finished_valid": sum(o["valid"] for o in outs),
            "finish": sorted({str(o["finish"]) for o in outs})}


_WORDS = ["house", "river", "green", "market", "window", "paper", "summer", "engine", "garden",
          "letter", "stone", "music", "yellow", "doctor", "island", "winter", "bridge", "camera",
          "forest", "silver"]


def _long_prompt(tokens: int, salt: int) -> str:
    """About ``tokens`` tokens of text no other prompt of the run shares a prefix with."""
    rng = random.Random(salt)
    words = " ".join(rng.choice(_WORDS) for _ in range(tokens - 24))
    return f"Request {salt}: count the words below.\n{words}"


async def _ttft(url: str, tokens: int, salt: int) -> tuple[int, float]:
    """The prompt tokens the server counted and the seconds to the first token."""
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", timeout=3600) as client:
        t0 = time.perf_counter()
        reply = await client.chat.completions.create(
            model="default", max_tokens=1, temperature=0.0,
            messages=[{"role": "user", "content": _long_prompt(tokens, salt)}])
        seconds = time.perf_counter() - t0
    return (reply.usage.prompt_tokens if reply.usage else tokens), round(seconds, 2)


def _serve(cmd: list[str], log: Path) -> tuple[subprocess.Popen[bytes], str, float]:
    """Start a server; returns it, its URL and the seconds to healthy (raises with the log)."""
    port = free_port()
    t0 = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen([*cmd, "--host", "127.0.0.1", "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    while proc.poll() is None:
        if request("GET", url + "/health", timeout=10)[0] == 200:
            return proc, url, time.perf_counter() - t0
        time.sleep(1.0)
    raise RuntimeError(f"{cmd[0]} exited:\n{log.read_text()[-4000:]}")


class _PeakRss:
    """The largest resident memory of a process and its children, sampled every 0.5 s."""

    def __init__(self, pid: int) -> None:
        self.peak, self._stop = 0, threading.Event()
        self._proc = psutil.Process(pid)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def now(self) -> int:
        procs = [self._proc, *self._proc.children(recursive=True)]
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.peak = max(self.peak, self.now())
            except psutil.Error:
                return

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="smollm2-1.7b", choices=sorted(SHAPES))
    ap.add_argument("--streams", default="1,8")
    ap.add_argument("--workloads", default="plain,json,tools")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--cache", type=Path, default=None, help="default: model_shapes.default_dir()")
    ap.add_argument("--qtype", default="Q4_1", help="the generated file's type (model_shapes)")
    ap.add_argument("--ttft", default="", help="prompt lengths to time to first token")
    ap.add_argument("--server-args", default="", help="more `grammarserve serve` arguments")
    ap.add_argument("--gguf", type=Path, default=None,
                    help="serve this file instead (e.g. one llama-quantize wrote from --shape's)")
    args = ap.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    ttft = [int(t) for t in args.ttft.split(",") if t]
    workloads = args.workloads.split(",")
    args.cache = args.cache or default_dir()
    gguf = args.gguf or make_gguf(args.shape, args.cache, qtype=args.qtype)
    line: dict[str, Any] = {**stamp(), "bench": "shapes", "shape": args.shape,
                            "file": gguf.name, "max_tokens": args.max_tokens,
                            "rounds": args.rounds}
    servers = {"grammarserve": [GRAMMARSERVE, "serve", "--model", str(gguf), *args.server_args.split(),
                                "--log-level", "info"]}
    if not args.no_peer and args.llama_server.is_file():
        slots = max(streams)
        ctx = max(4096 * slots, -(-(max(ttft, default=0) + 512) // 1024) * 1024 * slots)
        servers["llama-server"] = [str(args.llama_server), "-m", str(gguf), "-c", str(ctx),
                                   "-np", str(slots), "-t", "2", "--jinja"]
    results: dict[str, Any] = {}
    for name, cmd in servers.items():
        log = args.cache / f"{name}.log"
        proc, url, startup = _serve(cmd, log)
        rss = _PeakRss(proc.pid)
        ready_rss = rss.now()
        try:
            cells = {f"{w}@{s}": asyncio.run(_cell(url, w, s, args.rounds, args.max_tokens))
                     for s in streams for w in workloads}
            firsts = [asyncio.run(_ttft(url, t, salt)) for salt, t in enumerate(ttft)]
        finally:
            peak_rss = rss.stop()
            proc.terminate()
            proc.wait(60)
        plan = next((ln.strip() for ln in log.read_text().splitlines() if "memory plan" in ln),
                    None)
        results[name] = {"startup_s": round(startup, 1), "plan": plan,
                         "rss_ready_gb": round(ready_rss / 1e9, 2),
                         "rss_peak_gb": round(peak_rss / 1e9, 2), "cells": cells,
                         "ttft": {str(n): s for n, s in firsts}}
        print(json.dumps({"server": name, **results[name]}), file=sys.stderr, flush=True)
    line["servers"] = results
    ours = results["grammarserve"]["cells"]
    if "llama-server" in results:
        peer = results["llama-server"]["cells"]
        line["rss_peak_over_llama"] = round(results["grammarserve"]["rss_peak_gb"]
                                            / results["llama-server"]["rss_peak_gb"], 2)
        line["ours_over_llama"] = {k: {m: round(ours[k][m] / peer[k][m], 2)
                                       for m in ("tok_s", "decode_tok_s")
                                       if ours[k][m] and peer[k][m]} for k in ours}
    if "llama-server" in results and ttft:
        line["ttft_over_llama"] = {
            str(t): round(a / b, 3) for t, a, b in zip(
                ttft, results["grammarserve"]["ttft"].values(),
                results["llama-server"]["ttft"].values())}
    line["constrained_over_plain"] = {
        f"{name}:{w}@{s}": round(r["cells"][f"{w}@{s}"]["tok_s"]
                                 / r["cells"][f"plain@{s}"]["tok_s"], 2)
        for name, r in results.items() for s in streams for w in workloads
        if w != "plain" and "plain" in workloads}
    print(json.dumps(line))


if __name__ == "__main__":
    main()
