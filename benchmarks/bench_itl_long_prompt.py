"""Inter-token latency of running streams while a long prompt prefills beside them: the
stall-free mixing check of ``engine/step_pacer.py``.

Starts the server, runs ``--streams`` streamed chat replies (EOS ignored, long ``max_tokens``),
measures their inter-token latency (ITL) for ``--alone-s`` seconds alone (phase "alone"),
then sends one chat request of ``--prompt-tokens`` prompt tokens (``max_tokens`` 8) and measures
the streams' ITL from its send until its first token, i.e. while it is prefilled (phase
"long"). A gap belongs to the phase its closing token falls in. The acceptance bound is
ITL p99 during the prefill <= 3x the ITL p99 alone (``p99_ratio``). ``/metrics`` is sampled
every 0.2 s for the pacer's prefill cap (``prefill_cap_tokens``) and the forward count.

    python benchmarks/bench_itl_long_prompt.py [--server-args "--step-time-target-s 0"]
    python benchmarks/bench_itl_long_prompt.py --shape smollm2-1.7b --prompt-tokens 4000

Prints one JSON line (``--out``: also appends it to that file).
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

sys.path.append(str(Path(__file__).resolve().parent))
from machine import stamp
from model_shapes import SHAPES, default_dir, make_gguf
from serverproc import ServerProcess, metrics, request

STREAM_PROMPTS = [
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Describe, step by step and in great detail, how a city water system works.",
    "Tell the history of sailing ships from the earliest rafts to modern yachts.",
    "Write a long travel diary of a journey by train across a large continent.",
]


@dataclass
class Stream:
    """One streamed chat reply: the arrival time of each content chunk."""

    times: list[float] = field(default_factory=list)
    first_s: float | None = None  # time to the first content chunk
    error: str | None = None


def stream_chat(url: str, body: dict[str, Any], into: Stream, stop: threading.Event,
                timeout: float) -> None:
    """POST a streamed chat completion and record each content chunk's time until it ends
    or ``stop`` is set (then the connection is closed: the server aborts the request)."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=timeout)
    t0 = time.monotonic()
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps({**body, "stream": True}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            into.error = f"{resp.status}: {resp.read()[:200]!r}"
            return
        while not stop.is_set():
            line = resp.readline()
            if not line:
                break
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if any((c.get("delta") or {}).get("content") for c in chunk.get("choices", [])):
                now = time.monotonic()
                into.times.append(now)
                if into.first_s is None:
                    into.first_s = now - t0
    except (OSError, ValueError) as e:
        into.error = f"{type(e).__name__}: {e}"
    finally:
        conn.close()


def long_text(url: str, tokens: int) -> tuple[str, int]:
    """A user message whose chat prompt is about ``tokens`` tokens (counted by ``/tokenize``)
    and that count."""
    def make(n: int) -> str:
        return "Summarise: " + " ".join(f"item{i % 97} costs {i % 13} dollars." for i in range(n))

    n = tokens // 6
    for _ in range(4):
        text = make(n)
        status, body = request("POST", url + "/tokenize", {
            "messages": [{"role": "user", "content": text}], "add_generation_prompt": True})
        if status != 200:
            raise RuntimeError(f"/tokenize: {status} {body}")
        count = int(body["count"])
        if abs(count - tokens) <= 8:
            return text, count
        n = max(1, n + (tokens - count) * n // max(count, 1))
    return text, count


def gaps(times: list[float], start: float, end: float) -> list[float]:
    """The gaps between consecutive chunks whose closing chunk falls in ``(start, end]``."""
    return [b - a for a, b in itertools.pairwise(times) if start < b <= end]


def pct(xs: list[float], q: float) -> float | None:
    """The ``q``-quantile (nearest rank) of ``xs`` in ms."""
    if not xs:
        return None
    s = sorted(xs)
    return round(1000 * s[min(len(s) - 1, max(0, round(q * len(s)) - 1))], 1)


def summary(xs: list[float]) -> dict[str, Any]:
    return {"n": len(xs), "p50_ms": pct(xs, 0.5), "p90_ms": pct(xs, 0.9), "p99_ms": pct(xs, 0.99),
            "max_ms": pct(xs, 1.0),
            "mean_ms": round(1000 * statistics.fmean(xs), 1) if xs else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default=None, choices=sorted(SHAPES),
                    help="serve a generated file of this shape (default: the embedded model)")
    ap.add_argument("--gguf", type=Path, default=None, help="serve this file")
    ap.add_argument("--server-args", default="", help="more `grammarserve serve` arguments")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=8000)
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--alone-s", type=float, default=10.0)
    ap.add_argument("--stream-max-tokens", type=int, default=6000)
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", type=Path, default=None, help="also append the line here")
    args = ap.parse_args()
    model = args.gguf or (make_gguf(args.shape, default_dir()) if args.shape else None)
    log = Path(tempfile.mkdtemp(prefix="bench-itl-long-")) / "server.log"
    srv = ServerProcess(log, *(["--model", str(model)] if model else []),
                        "--num-threads", str(args.threads),
                        "--max-model-len", str(args.max_model_len), *args.server_args.split())
    srv.start(timeout=1800)
    stop = threading.Event()
    samples: list[tuple[float, float, float]] = []  # (time, prefill cap, forwards)
    try:
        text, prompt_tokens = long_text(srv.url, args.prompt_tokens)

        def sample() -> None:
            while not stop.is_set():
                m = metrics(srv.url)
                samples.append((time.monotonic(), m.get("grammarserve_prefill_cap_tokens", -1),
                                m.get("grammarserve_forward_passes_total", -1)))
                stop.wait(0.2)

        streams = [Stream() for _ in range(args.streams)]
        threads = [threading.Thread(target=stream_chat, daemon=True, args=(srv.url, {
            "model": "default", "max_tokens": args.stream_max_tokens, "temperature": 0,
            "ignore_eos": True, "messages": [{"role": "user", "content": p}]}, s, stop,
            args.timeout_s)) for s, p in zip(streams, STREAM_PROMPTS * args.streams)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + args.timeout_s
        while any(len(s.times) < 5 and s.error is None for s in streams):
            if time.monotonic() > deadline:
                raise RuntimeError("the streams did not start")
            stop.wait(0.05)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t_alone = time.monotonic()
        stop.wait(args.alone_s)
        long_stream = Stream()
        t_send = time.monotonic()
        long_t = threading.Thread(target=stream_chat, daemon=True, args=(srv.url, {
            "model": "default", "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": text}]}, long_stream, threading.Event(),
            args.timeout_s))
        long_t.start()
        long_t.join(args.timeout_s)
        t_first = (t_send + long_stream.first_s if long_stream.first_s is not None
                   else time.monotonic())
        stop.wait(0.5)
    finally:
        stop.set()
        m = metrics(srv.url)
        srv.stop()
    alone = [g for s in streams for g in gaps(s.times, t_alone, t_send)]
    during = [g for s in streams for g in gaps(s.times, t_send, t_first)]
    a, b = summary(alone), summary(during)
    in_prefill = [x for x in samples if t_send <= x[0] <= t_first]
    caps = sorted({int(x[1]) for x in in_prefill})
    fwd = (in_prefill[-1][2] - in_prefill[0][2]) if len(in_prefill) > 1 else None
    out = {"bench": "itl_long_prompt", **stamp(), "label": args.label,
           "file": model.name if model else "default", "server_args": args.server_args,
           "threads": args.threads, "streams": args.streams, "prompt_tokens": prompt_tokens,
           "alone": a, "during_prefill": b,
           "p99_ratio": round(b["p99_ms"] / a["p99_ms"], 2) if a["p99_ms"] and b["p99_ms"]
           else None,
           "p50_ratio": round(b["p50_ms"] / a["p50_ms"], 2) if a["p50_ms"] and b["p50_ms"]
           else None,
           "p90_ratio": round(b["p90_ms"] / a["p90_ms"], 2) if a["p90_ms"] and b["p90_ms"]
           else None,
           "long_ttft_s": round(long_stream.first_s, 2) if long_stream.first_s else None,
           "long_error": long_stream.error,
           "stream_errors": [s.error for s in streams if s.error],
           "prefill_cap_min": caps[0] if caps else None,
           "prefill_cap_max": caps[-1] if caps else None,
           "steps_in_prefill_sampled": fwd,
           "mean_step_ms_in_prefill": round(1000 * (in_prefill[-1][0] - in_prefill[0][0]) / fwd, 1)
           if fwd else None,
           "server_itl_count": m.get("grammarserve_inter_token_latency_seconds_count")}
    line = json.dumps(out)
    print(line)
    if args.out is not None:
        with open(args.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
