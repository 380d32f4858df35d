"""A real shape served with no memory flags: ``grammarserve serve --model <GGUF>`` starts (the
memory plan sizes the KV pool, the decode mirror, the host tier and the activations from what the
weights leave), and serves ``--requests`` concurrent completions of ``--prompt-tokens`` each.

Prints the start-up plan line the server logged, then one raw JSON line: the plan as /metrics
reports it, start-up seconds, each request's seconds and prompt tokens, and the wall time of the
wave. Also prints the one-line refusal the same model gets before loading on a machine with
``--refuse-gib`` GiB available (the check the engine runs first; no server needed).

    .venv/bin/python benchmarks/bench_memory_plan.py --shape smollm2-1.7b
    .venv/bin/python benchmarks/bench_memory_plan.py --shape llama-3.2-1b
"""

from __future__ import annotations

import argparse
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from machine import stamp
from model_shapes import default_dir, make_gguf
from serverproc import ServerProcess, metrics, request

from grammarserve.config import EngineConfig
from grammarserve.engine.memory import weights_fit_refusal

WORDS = ("invoice", "order", "customer", "shipping", "address", "amount", "total", "tax", "item",
         "quantity", "price", "date", "account", "payment", "method", "reference", "number",
         "status", "pending", "delivered", "returned", "note", "warehouse", "region", "supplier",
         "contract", "renewal", "discount", "currency", "balance", "credit")


def prompt(seed: int, words: int) -> str:
    """Distinct text per request (no shared prefix for the cache to serve)."""
    rng = random.Random(seed)
    return f"Record {seed}: " + " ".join(rng.choice(WORDS) for _ in range(words))


def refusal_line(gguf: Path, gib: float) -> str:
    """The error the engine raises before loading ``gguf`` (CPU defaults) with ``gib`` GiB
    available, or a note that it would fit."""
    c = EngineConfig(model=str(gguf), device="cpu").resolved()
    error = weights_fit_refusal(c, int(gib * 2**30))
    return str(error) if error is not None else f"fits in {gib} GiB"


def one(url: str, model: str, i: int, words: int, max_tokens: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    status, body = request("POST", url + "/v1/completions", {
        "model": model, "prompt": prompt(i, words), "max_tokens": max_tokens,
        "temperature": 0, "ignore_eos": True}, timeout=3600)
    took = time.perf_counter() - t0
    usage = body.get("usage", {}) if isinstance(body, dict) else {}
    return {"status": status, "s": round(took, 2), "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            **({} if status == 200 else {"error": str(body)[:300]})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="smollm2-1.7b")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder of the generated GGUF (default: the shapes' cache)")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prompt-words", type=int, default=1900,
                    help="words per prompt (~2,000 tokens with these words)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--num-threads", default="2")
    ap.add_argument("--refuse-gib", type=float, default=4.0)
    args = ap.parse_args()
    out = args.out or default_dir()
    gguf = make_gguf(args.shape, out)
    log = out / f"serve-{args.shape}.log"
    log.write_text("")
    server = ServerProcess(log, "--model", str(gguf), "--log-level", "info",
                           "--num-threads", args.num_threads)
    t0 = time.perf_counter()
    server.start(timeout=1800)
    startup = time.perf_counter() - t0
    try:
        plan = [line for line in log.read_text().splitlines() if "memory plan:" in line]
        print("\n".join(plan), flush=True)
        model = request("GET", server.url + "/v1/models")[1]["data"][0]["id"]
        t1 = time.perf_counter()
        with ThreadPoolExecutor(args.requests) as pool:
            results = list(pool.map(lambda i: one(server.url, model, i, args.prompt_words,
                                                  args.max_tokens), range(args.requests)))
        wall = time.perf_counter() - t1
        m = metrics(server.url)
    finally:
        server.stop()
    print(refusal_line(gguf, args.refuse_gib), flush=True)  # NOTE: the server converted it
    keys = ("kv_capacity", "kv_pool_bytes", "kv_mirror_tokens", "kv_host_tier_limit_bytes",
            "memory_weights_bytes", "memory_available_bytes", "memory_activation_bytes",
            "preemptions_total")
    print(json.dumps({
        **stamp(), "bench": "memory_plan", "shape": args.shape,
        "startup_s": round(startup, 1), "wave_s": round(wall, 1),
        "ok": sum(r["status"] == 200 for r in results), "requests": results,
        "metrics": {k: m.get(f"grammarserve_{k}") for k in keys}}), flush=True)


if __name__ == "__main__":
    main()
