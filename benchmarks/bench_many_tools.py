"""Many tools in one request (issue 34, item 5): for tool sets of several sizes
(``many_tools.py``), one ``tool_choice="required"`` chat request, streamed, first with the tool
set new to the server (its grammar compiled and its prompt prefilled from scratch: a prefix-cache
namespace of its own), then the same request again (grammar and prompt prefix cached) and with
another user question (the agent's next call: the tool block cached, the question new).
Reports per size: prompt tokens, the server's time to first token (its histogram's sum, one
request at a time) cold / cached / next question, the time to the first tool-call delta (after
the name), the tool-call grammar's compile time cold and cached (in this process, the engine's
grammar options), and whether each call validates against its tool's schema.

    .venv/bin/python benchmarks/bench_many_tools.py --tools 3,30,60
    .venv/bin/python benchmarks/bench_many_tools.py --tools 3,60 --repeat 5
    .venv/bin/python benchmarks/make_long_context_model.py /tmp/smollm2-32k-random   # then:
    .venv/bin/python benchmarks/bench_many_tools.py --model /tmp/smollm2-32k-random \
        --tools 3,60,160 --repeat 3

Prints one JSON line (git revision, CPU, time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import jsonschema
from openai import OpenAI
from transformers import AutoTokenizer

from grammarserve.config import EngineConfig
from grammarserve.fsm import GrammarCompiler
from grammarserve.models.loader import resolve_model_folder

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import cpu_name, revision
from many_tools import tool_set
from serverproc import ServerProcess, metrics

TTFT = "grammarserve_time_to_first_token_seconds_sum"
QUESTIONS = ("What's the weather in Lisbon right now, in celsius?",
             "Send an e-mail to ana@example.com saying the report is ready.")
# Further next questions (--repeat): each new after the tool block, so none is cached itself.
MORE_NEXT = ("Book a table for four at Lumi tomorrow evening, please.",
             "Track the parcel 1Z999AA10123456784 for me.",
             "Create a ticket about the broken login page, high priority.",
             "Convert 12 miles into kilometres.",
             "Find Italian restaurants near Alfama.",
             "List my unread e-mails in the inbox.",
             "Refund payment pay_123 in full, the customer was charged twice.",
             "Deploy api version 2.1 to staging.")


def _ask(client: OpenAI, url: str, tools: list[dict[str, Any]], question: str, namespace: str,
         max_tokens: int) -> dict[str, Any]:
    ttft_sum = metrics(url).get(TTFT, 0.0)
    t0 = time.perf_counter()
    first: float | None = None
    name, args, prompt_tokens, finish = "", "", 0, None
    stream = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": question}], tools=tools,
        tool_choice="required", temperature=0, max_tokens=max_tokens, stream=True,
        stream_options={"include_usage": True}, extra_body={"cache_namespace": namespace})
    for chunk in stream:
        if chunk.usage is not None:
            prompt_tokens = chunk.usage.prompt_tokens
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                if first is None:
                    first = time.perf_counter() - t0
                if call.function is not None:
                    name = name or (call.function.name or "")
                    args += call.function.arguments or ""
    total = time.perf_counter() - t0
    schema = next((t["function"]["parameters"] for t in tools
                   if t["function"]["name"] == name), None)
    valid = False
    if schema is not None:
        try:
            jsonschema.validate(json.loads(args), schema)
            valid = True
        except (ValueError, jsonschema.ValidationError):
            pass
    time.sleep(0.2)  # NOTE: the engine's metrics reach the server with its next snapshot
    server_ttft = metrics(url).get(TTFT, 0.0) - ttft_sum
    return {"server_ttft_s": round(server_ttft, 3),
            "first_call_delta_s": round(first if first is not None else total, 3),
            "total_s": round(total, 3), "tool": name, "valid": valid, "finish": finish,
            "prompt_tokens": prompt_tokens}


def _compile_times(tools: list[dict[str, Any]], tokenizer: Any) -> dict[str, float]:
    """The tool-call grammar's compile, in this process with the engine's grammar options:
    first (cold) and again (the cache), for ``required`` and ``auto``."""
    compiler = GrammarCompiler(tokenizer, **EngineConfig().grammar_options)
    out = {}
    for mode, fmt in (("required", "json_array"), ("auto", "hermes")):
        for label in ("cold", "cached"):
            t0 = time.perf_counter()
            compiler.compile_tool_calls(tools, mode, call_format=fmt)
            out[f"{mode}_{label}_s"] = round(time.perf_counter() - t0, 4)
    return out


def _spread(key: str, asks: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and range of the server TTFT and the first call delta over repeated asks."""
    out: dict[str, Any] = {}
    for what in ("server_ttft", "first_call_delta"):
        vals = sorted(a[f"{what}_s"] for a in asks)
        out[f"{key}_{what}_median_s"] = round(statistics.median(vals), 3)
        out[f"{key}_{what}_range_s"] = [vals[0], vals[-1]]
    out[f"{key}_valid"] = f"{sum(a['valid'] for a in asks)}/{len(asks)}"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tools", default="3,30,60", help="comma-separated tool-set sizes")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--server-arg", action="append", default=[])
    ap.add_argument("--model", default="default",
                    help="the server's model (a folder with random weights of a longer context)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="per size, ask the cached request and a new next question this often "
                         "(medians and ranges reported)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.tools.split(",")]
    rows: dict[str, Any] = {}
    nexts = (QUESTIONS[1], *MORE_NEXT)
    if args.repeat > len(nexts):
        ap.error(f"--repeat is at most {len(nexts)}")
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_folder(args.model)))
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(Path(tmp) / "server.log", "--model", args.model,
                               *args.server_arg)
        server.start()
        try:
            client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
            _ask(client, server.url, tool_set(2), "Hi", "warmup", 8)  # NOTE: kernels, first compile
            for n in sizes:
                tools, ns = tool_set(n), uuid.uuid4().hex
                cold = _ask(client, server.url, tools, QUESTIONS[0], ns, args.max_tokens)
                cached, nxt = [], []
                for i in range(args.repeat):  # side by side: cached, next, cached, next, ...
                    cached.append(_ask(client, server.url, tools, QUESTIONS[0], ns,
                                       args.max_tokens))
                    nxt.append(_ask(client, server.url, tools, nexts[i], ns, args.max_tokens))
                rows[str(n)] = {"cold": cold, "cached": cached[0], "next_question": nxt[0],
                                "grammar_compile": _compile_times(tools, tokenizer)}
                if args.repeat > 1:
                    rows[str(n)] |= {"cached_all": cached, "next_question_all": nxt,
                                     **_spread("cached", cached), **_spread("next", nxt)}
                print(f"# {n} tools: {rows[str(n)]}", file=sys.stderr)
        finally:
            server.stop()
    base = rows.get(str(min(sizes)), {})
    for n, row in rows.items():
        for key in ("cached", "next_question"):
            if base:
                row[f"{key}_ttft_vs_smallest"] = round(
                    row[key]["server_ttft_s"] / max(base[key]["server_ttft_s"], 1e-6), 2)
        for key in ("cached", "next"):
            for what in ("server_ttft", "first_call_delta"):
                med = f"{key}_{what}_median_s"
                if base and med in row:
                    row[f"{key}_{what}_median_vs_smallest"] = round(
                        row[med] / max(base[med], 1e-6), 2)
    print(json.dumps({"bench": "many_tools", "git": revision(), "cpu": cpu_name(),
                      "model": args.model, "repeat": args.repeat,
                      "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "sizes": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
