"""The long-step reproduction: one chat request with a long prompt on a large model (a prefill
step of many seconds), a Prometheus scrape 1.5 s later, then a short request; every request
must be answered, every scrape must answer within its 3 s client timeout, and ``/health``
must answer at once throughout (200 while the engine progresses).

Before the engine client published its counters and guarded its reader, the scrape timed out
after 10 s, its late answer killed the reader thread, and the server answered nothing more
while ``/health`` said ok.

    python benchmarks/repro_long_step.py --shape smollm2-1.7b --prompt-tokens 4500

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent))
from machine import stamp  # noqa: E402
from model_shapes import SHAPES, default_dir, make_gguf  # noqa: E402
from serverproc import ServerProcess, metrics, request  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="smollm2-1.7b", choices=sorted(SHAPES))
    ap.add_argument("--prompt-tokens", type=int, default=4500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--gguf", type=Path, default=None, help="serve this file of the shape")
    ap.add_argument("--server-args", default="", help="more `grammarserve serve` arguments")
    args = ap.parse_args()
    model = args.gguf or make_gguf(args.shape, default_dir())
    log = Path(tempfile.mkdtemp(prefix="repro-long-step-")) / "server.log"
    srv = ServerProcess(log, "--model", str(model), "--num-threads", str(args.threads),
                        *args.server_args.split())
    t_start = time.monotonic()
    srv.start(timeout=1800)
    started_s = time.monotonic() - t_start
    health: list[tuple[float, int, float]] = []
    scrapes: list[tuple[float, int, float]] = []
    done = threading.Event()
    t0 = time.monotonic()

    def probe(path: str, into: list[tuple[float, int, float]], every: float) -> None:
        while not done.is_set():
            t = time.monotonic()
            status, _ = request("GET", srv.url + path, timeout=3)
            into.append((round(t - t0, 1), status, round(time.monotonic() - t, 3)))
            done.wait(every)

    replies: dict[str, Any] = {}

    def chat(name: str, text: str, max_tokens: int) -> None:
        t = time.monotonic()
        status, body = request("POST", srv.url + "/v1/chat/completions", {
            "model": "default", "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": text}]}, timeout=args.timeout_s)
        replies[name] = {"status": status, "seconds": round(time.monotonic() - t, 1),
                         "finish": body["choices"][0]["finish_reason"] if status == 200
                         else str(body)[:200]}

    # ~1 token a word on SmolLM2's and Llama's tokenizers
    words = " ".join(f"item{i % 97} costs {i % 13} dollars." for i in range(args.prompt_tokens // 6))
    long_req = threading.Thread(target=chat, args=("long", "Summarise: " + words, 16))
    health_t = threading.Thread(target=probe, args=("/health", health, 1.0), daemon=True)
    long_req.start()
    health_t.start()
    done.wait(1.5)
    first = threading.Thread(target=probe, args=("/metrics", scrapes, 5.0), daemon=True)
    first.start()
    done.wait(0.5)
    hello = threading.Thread(target=chat, args=("hello", "Hello", 8))
    hello.start()
    long_req.join(args.timeout_s + 10)
    hello.join(args.timeout_s + 10)
    done.set()
    m = metrics(srv.url)
    srv.stop()
    out = {"bench": "repro_long_step", **stamp(), "shape": args.shape, "file": model.name,
           "server_args": args.server_args,
           "prompt_tokens": args.prompt_tokens, "threads": args.threads,
           "server_start_s": round(started_s, 1), "replies": replies,
           "all_answered": all(r["status"] == 200 for r in replies.values()) and len(replies) == 2,
           "scrapes": len(scrapes), "scrape_max_s": max((s[2] for s in scrapes), default=None),
           "scrapes_failed": sum(1 for s in scrapes if s[1] != 200),
           "health_checks": len(health), "health_max_s": max((h[2] for h in health), default=None),
           "health_not_200": sum(1 for h in health if h[1] != 200),
           "engine_restarts": m.get("grammarserve_engine_restarts_total"),
           "engine_stalls": m.get("grammarserve_engine_stalls_total")}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
