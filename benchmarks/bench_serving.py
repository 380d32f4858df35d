"""The server under load, through the official OpenAI SDK (``openai.AsyncOpenAI``).

A load generator against any OpenAI-compatible server: without ``--base-url`` it starts our own
(``grammarserve serve --model default --port <free> --kv-cache-tokens 65536``) as a subprocess,
waits for ``GET /health`` == 200 and stops it at the end; with ``--base-url`` (e.g.
``http://127.0.0.1:8000/v1`` for vLLM or llama-server) it uses that server as it is.

Workloads (``--workload``):
- ``extraction``: the JSON-extraction workload of ``extraction_workload.py`` (shared instruction
  prompt + one document), ``response_format`` json_schema strict; valid = the reply parses and
  validates against the schema. With the defaults (32 documents, concurrency 8, ``max_tokens``
  160, greedy, ``--few-shot-style spaced``: the few-shot answers are plain ``json.dumps`` output)
  it is the extraction workload of issue 15. ``--few-shot-style compact|indented|none`` writes
  the answers with ``","``/``":"``, with ``indent=2``, or leaves the examples out.
- ``tools``: an agent turn with 3 tools, ``tool_choice="required"``; valid = every tool call has a
  known name and arguments that validate against that tool's parameters (``--strict-tools`` sets
  ``strict: true`` on the tools). Multi-turn: every other request (odd indices) carries a prior
  turn first (user request, an assistant message with one ``tool_calls`` entry, the ``tool``
  result), then a new user request; ``--single-turn`` sends only the one-turn requests, as
  before. The JSON line reports ``multi_turn`` (how many requests carried a prior turn).
- ``chat``: plain questions, no constraint (valid = a non-empty reply).

Every request streams (``stream_options.include_usage``) so TTFT (first content or tool-call
delta) and inter-chunk latency are measured. Prints one JSON line (``--label NAME`` adds
``"server": NAME`` to it).

Headline figures (``figures.py``; constrained workloads, null for ``chat``), all over *every*
request sent, since a reply cut by ``max_tokens`` or a failed request is a failure for the user:
``success_pct`` (valid replies / requests), ``goodput_valid_per_s`` (valid replies per second),
then ``valid_of_finished_pct`` (validity among replies not cut by ``max_tokens``; the same figure
as the older ``valid_pct``, kept), ``cut_by_length`` (finish_reason ``length``) and ``errors``.
Extraction also reports ``field_accuracy_pct`` (fields equal to the document's record, over all
requests). ``--dump-replies PATH`` writes one JSON line per request (text, tool calls,
finish_reason, valid, error) so the replies can be read, not only counted.

``--model``: default the first id of ``GET /v1/models`` (grammarserve: ``default``; vLLM: its
``--served-model-name``; llama-server lists its model file and accepts any name).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
import extraction_workload as wl
import tools_workload as tw
from figures import success_figures
from machine import cpu_name, revision
from serverproc import GRAMMARSERVE


def build_requests(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One kwargs dict per request (plus a ``_kind`` key for validation)."""
    n = args.requests
    base = {"max_tokens": args.max_tokens, "temperature": 0.0}
    out: list[dict[str, Any]] = []
    if args.workload == "extraction":
        fmt = {"type": "json_schema",
               "json_schema": {"name": "record", "schema": wl.SCHEMA, "strict": True}}
        for doc, rec in wl.documents(n):
            out.append({**base, "messages": wl.messages(doc, style=args.few_shot_style),
                        "response_format": fmt, "_expected": rec})
    elif args.workload == "tools":
        tools = [{"type": "function", "function": {**t["function"], "strict": True}}
                 for t in tw.TOOLS] if args.strict_tools else tw.TOOLS
        for i in range(n):
            multi = not args.single_turn and i % 2 == 1
            kw = {**base, "messages": tw.tool_messages(i, multi), "tools": tools,
                  "tool_choice": "required"}
            if args.no_parallel_tool_calls:
                kw["parallel_tool_calls"] = False
            out.append(kw)
    else:
        for i in range(n):
            out.append({**base, "messages": [{"role": "user", "content": tw.CHAT[i % len(tw.CHAT)]}]})
    return out


async def one(client: openai.AsyncOpenAI, model: str, kw: dict[str, Any]) -> dict[str, Any]:
    kw = {k: v for k, v in kw.items() if not k.startswith("_")}
    t0 = time.perf_counter()
    first: float | None = None
    stamps: list[float] = []
    text: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    finish = None
    usage = None
    stream = await client.chat.completions.create(
        model=model, stream=True, stream_options={"include_usage": True}, **kw)
    async for chunk in stream:
        now = time.perf_counter()
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            d = choice.delta
            got = False
            if d is not None and d.content:
                text.append(d.content)
                got = True
            if d is not None and d.tool_calls:
                for tc in d.tool_calls:
                    c = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                    if tc.function is not None:
                        c["name"] += tc.function.name or ""
                        c["arguments"] += tc.function.arguments or ""
                got = True
            if got:
                if first is None:
                    first = now
                stamps.append(now)
            if choice.finish_reason:
                finish = choice.finish_reason
    end = time.perf_counter()
    cached = None
    if usage is not None and usage.prompt_tokens_details is not None:
        cached = usage.prompt_tokens_details.cached_tokens
    return {"ttft": (first - t0) if first is not None else None, "latency": end - t0,
            "itl": [b - a for a, b in itertools.pairwise(stamps)], "text": "".join(text),
            "calls": [calls[k] for k in sorted(calls)], "finish": finish,
            "completion_tokens": usage.completion_tokens if usage else 0,
            "prompt_tokens": usage.prompt_tokens if usage else 0, "cached_tokens": cached}


def is_valid(workload: str, r: dict[str, Any]) -> bool:
    try:
        if workload == "extraction":
            jsonschema.validate(json.loads(r["text"]), wl.SCHEMA)
        elif workload == "tools":
            if not r["calls"]:
                return False
            for c in r["calls"]:
                if c["name"] not in tw.TOOL_PARAMS:
                    return False
                jsonschema.validate(json.loads(c["arguments"]), tw.TOOL_PARAMS[c["name"]])
        else:
            return bool(r["text"].strip())
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def counts_as_valid(workload: str, r: Any) -> bool:
    """A success: the request came back, was not cut by ``max_tokens`` and its reply is valid."""
    return isinstance(r, dict) and r["finish"] != "length" and is_valid(workload, r)


def correct_fields(r: Any, expected: dict[str, Any]) -> int:
    """Extraction: how many of the record's fields a valid reply got right."""
    try:
        obj = json.loads(r["text"])
    except ValueError:
        return 0
    return sum(obj.get(k) == v for k, v in expected.items()) if isinstance(obj, dict) else 0


def dump_replies(path: str, workload: str, results: list[Any]) -> None:
    """One JSON line per request, in request order."""
    with open(path, "w") as f:
        for i, r in enumerate(results):
            if isinstance(r, dict):
                line = {"i": i, "finish_reason": r["finish"],
                        "valid": counts_as_valid(workload, r), "text": r["text"],
                        "tool_calls": r["calls"], "completion_tokens": r["completion_tokens"]}
            else:
                line = {"i": i, "finish_reason": None, "valid": False, "text": None,
                        "tool_calls": [], "error": repr(r)[:1000]}
            f.write(json.dumps(line) + "\n")


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return round(xs[lo] + (xs[hi] - xs[lo]) * (k - lo), 4)


async def run_load(base_url: str, model: str | None, reqs: list[dict[str, Any]],
                   concurrency: int, timeout: float) -> tuple[list[Any], float, str]:
    # The SDK's default 2 retries: a peer that closes idle keep-alive connections (llama-server
    # after 5 s) otherwise fails the request that picks up the dead connection from the pool.
    client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=2, timeout=timeout)
    if model is None:
        model = (await client.models.list()).data[0].id
    sem = asyncio.Semaphore(concurrency)

    async def guarded(kw: dict[str, Any]) -> Any:
        async with sem:
            try:
                return await one(client, model, kw)
            except Exception as e:  # noqa: BLE001 - count and report every failure
                return e

    t0 = time.perf_counter()
    results = await asyncio.gather(*(guarded(kw) for kw in reqs))
    wall = time.perf_counter() - t0
    await client.close()
    return results, wall, model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(extra: list[str]) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = _free_port()
    log = Path(tempfile.mkstemp(prefix="bench_serving_", suffix=".log")[1])
    cmd = [GRAMMARSERVE, "serve", "--model", "default",
           "--port", str(port), "--kv-cache-tokens", "65536", "--log-level", "warning", *extra]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                cwd=Path(__file__).resolve().parent.parent)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("server exited:\n" + log.read_text())
        try:
            with urllib.request.urlopen(url + "/health", timeout=10) as r:
                if r.status == 200:
                    return proc, url + "/v1", log
        except (OSError, urllib.error.HTTPError):
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("server did not become healthy:\n" + log.read_text())


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def summarize(args: argparse.Namespace, results: list[Any], wall: float,
              expected: list[Any] | None = None) -> dict[str, Any]:
    ok = [r for r in results if isinstance(r, dict)]
    errors = [r for r in results if not isinstance(r, dict)]
    cut = [r for r in ok if r["finish"] == "length"]
    judged = [r for r in ok if r["finish"] != "length"]
    valid = sum(is_valid(args.workload, r) for r in judged)
    constrained = args.workload != "chat"
    head = success_figures(args.requests, valid, len(judged), len(cut), wall)
    if not constrained:  # a cut chat reply is no failure: no success figures for plain chat
        head = {k: None for k in head} | {"cut_by_length": len(cut)}
    comp = sum(r["completion_tokens"] for r in ok)
    prompt = sum(r["prompt_tokens"] for r in ok)
    cached = [r["cached_tokens"] for r in ok if r["cached_tokens"] is not None]
    ttfts = [r["ttft"] for r in ok if r["ttft"] is not None]
    itls = [x for r in ok for x in r["itl"]]
    out = {**({"server": args.label} if args.label else {}), "workload": args.workload,
           **({"few_shot_style": args.few_shot_style} if args.workload == "extraction" else {}),
           "requests": args.requests, "constrained": constrained, **head, "errors": len(errors),
           "concurrency": args.concurrency, "max_tokens": args.max_tokens,
           "completed": len(ok), "wall_s": round(wall, 2),
           "requests_per_s": round(len(ok) / wall, 3),
           "completion_tok_per_s": round(comp / wall, 2), "completion_tokens": comp,
           "ttft_p50": pct(ttfts, 0.5), "ttft_p95": pct(ttfts, 0.95),
           "latency_p50": pct([r["latency"] for r in ok], 0.5),
           "itl_p50": pct(itls, 0.5),
           "cached_token_share": round(sum(cached) / prompt, 3) if cached and prompt else None,
           "valid_pct": round(100.0 * valid / len(judged), 1) if judged else None}
    if args.workload == "extraction" and expected is not None:
        right = sum(correct_fields(r, e) for r, e in zip(results, expected)
                    if counts_as_valid(args.workload, r))
        out["field_accuracy_pct"] = round(100.0 * right / (len(wl.SCHEMA["required"])
                                                           * args.requests), 1)
    if args.workload == "tools":
        out["strict_tools"] = args.strict_tools
        out["parallel_tool_calls"] = not args.no_parallel_tool_calls
        out["multi_turn"] = 0 if args.single_turn else args.requests // 2
    if errors:
        out["first_error"] = repr(errors[0])[:300]
    if args.verbose:
        for i, r in enumerate(results):
            if isinstance(r, dict) and (r["finish"] == "length" or not is_valid(args.workload, r)):
                print(f"# request {i} finish={r['finish']} text={r['text'][:200]!r} "
                      f"calls={r['calls']}", file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", default=None,
                    help="an OpenAI-compatible server (…/v1); default: start grammarserve")
    ap.add_argument("--model", default=None, help="model name (default: the first of /v1/models)")
    ap.add_argument("--workload", choices=["extraction", "tools", "chat"], default="extraction")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--few-shot-style", choices=wl.FEW_SHOT_STYLES, default="spaced",
                    help="extraction: the few-shot answers as json.dumps defaults (spaced, "
                         "', ' and ': '), compact (',' and ':'), indent=2, or no examples")
    ap.add_argument("--dump-replies", metavar="PATH", default=None,
                    help="write each reply (text, tool calls, finish_reason, valid) as JSONL")
    ap.add_argument("--strict-tools", action="store_true")
    ap.add_argument("--single-turn", action="store_true",
                    help="tools: no request carries a prior tool-call turn (default: every other)")
    ap.add_argument("--label", default=None,
                    help="add \"server\": LABEL to the JSON line (e.g. grammarserve, vllm)")
    ap.add_argument("--no-parallel-tool-calls", action="store_true",
                    help="send parallel_tool_calls=false (at most one call per reply)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="per request, seconds")
    ap.add_argument("--warmup", type=int, default=0,
                    help="first send this many further requests of the workload, one at a time "
                         "and untimed (warms the shared prompt in every server's prefix cache)")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="extra argument for our own server (repeatable), e.g. --num-threads=2")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="print invalid and cut replies to stderr")
    args = ap.parse_args()

    reqs = build_requests(argparse.Namespace(**{**vars(args),
                                                "requests": args.requests + args.warmup}))
    reqs, warm = reqs[:args.requests], reqs[args.requests:]
    proc = None
    base_url = args.base_url
    if base_url is None:
        proc, base_url, log = start_server(args.server_arg)
    try:
        if warm:
            asyncio.run(run_load(base_url, args.model, warm, 1, args.timeout))
        results, wall, _ = asyncio.run(run_load(base_url, args.model, reqs, args.concurrency,
                                                args.timeout))
    finally:
        if proc is not None:
            stop_server(proc)
            os.unlink(log)
    if args.dump_replies:
        dump_replies(args.dump_replies, args.workload, results)
    line = summarize(args, results, wall, [kw.get("_expected") for kw in reqs])
    print(json.dumps({**line, "git": revision(), "cpu": cpu_name(),
                      "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}))


if __name__ == "__main__":
    main()
