"""Single-stream decode speed of a running OpenAI-compatible server: what one interactive user
feels. One streamed chat reply at a time, ``--max-tokens`` tokens with EOS ignored
(``ignore_eos``: grammarserve, vLLM and llama-server all take it), ``--repeats`` times; decode
tokens/s of a reply = (completion tokens - 1) / (time of the last content chunk - time of the
first). Prints one JSON line with the median and every run.

    .venv/bin/python benchmarks/bench_stream.py --base-url http://127.0.0.1:8471/v1 [--label NAME]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import openai
from machine import stamp

PROMPT = ("Write a long, detailed story about a lighthouse keeper who finds a message in a "
          "bottle, and what happens over the following year.")


def one(client: openai.OpenAI, model: str, max_tokens: int) -> dict[str, Any]:
    """One streamed reply: TTFT, decode tokens/s and the token count."""
    t0 = time.perf_counter()
    first = last = None
    usage = None
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=max_tokens,
        temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True})
    for chunk in stream:
        now = time.perf_counter()
        if chunk.usage is not None:
            usage = chunk.usage
        if any(c.delta is not None and c.delta.content for c in chunk.choices):
            first = first or now
            last = now
    tokens = usage.completion_tokens if usage is not None else 0
    span = (last - first) if first is not None and last is not None else 0.0
    return {"ttft_s": round((first or t0) - t0, 4), "completion_tokens": tokens,
            "decode_tok_s": round((tokens - 1) / span, 1) if span > 0 and tokens > 1 else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--base-url", default="http://127.0.0.1:8471/v1")
    ap.add_argument("--model", default="default")
    ap.add_argument("--label", default="")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", max_retries=0, timeout=600)
    one(client, args.model, 8)  # warm-up (lazy start-up work, the prompt's prefix cached)
    runs = [one(client, args.model, args.max_tokens) for _ in range(args.repeats)]
    rates = [r["decode_tok_s"] for r in runs if r["decode_tok_s"] is not None]
    print(json.dumps({**stamp(), "bench": "stream", "server": args.label, "workload": "decode",
                      "max_tokens": args.max_tokens,
                      "decode_tok_s": statistics.median(rates) if rates else None,
                      "ttft_s": statistics.median(r["ttft_s"] for r in runs), "runs": runs}))


if __name__ == "__main__":
    main()
