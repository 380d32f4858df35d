"""Requests with schemas the server has not seen, through HTTP: each one's latency cold (first
time: the server's compile checks the schema, the engine process compiles it too) and warm
(the same schemas again: both caches hit), one request at a time.

Chat completions with ``response_format`` ``json_schema`` (the schemas of
``schemas/realworld/``, in file order, ``strict`` off), ``max_tokens=1`` and greedy, so a
request is its compiles, its prefill and one token. Prints one JSON line::

    .venv/bin/python benchmarks/bench_cold_requests.py [--limit 100]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import stamp
from serverproc import ROOT, ServerProcess, request


def _pcts(ms: list[float]) -> dict[str, float]:
    s = sorted(ms)
    return {"p50_ms": round(s[len(s) // 2], 1), "p90_ms": round(s[int(0.9 * len(s))], 1),
            "max_ms": round(s[-1], 1), "requests": len(s)}


def _send(url: str, schema: Any) -> tuple[int, float]:
    body = {"model": "default", "max_tokens": 1, "temperature": 0,
            "messages": [{"role": "user", "content": "Reply with a JSON object."}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "reply", "schema": schema}}}
    start = time.perf_counter()
    status, _ = request("POST", url + "/v1/chat/completions", body)
    return status, (time.perf_counter() - start) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=100, help="schemas to send (0 = all)")
    args = ap.parse_args()
    folder = ROOT / "schemas" / "realworld"
    schemas = [json.loads(p.read_text())["schema"] for p in sorted(folder.glob("*.json"))]
    schemas = schemas[:args.limit] if args.limit else schemas
    out: dict[str, Any] = {"bench": "cold_requests", "schemas": len(schemas)}
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(Path(tmp) / "server.log")
        server.start()
        try:
            _send(server.url, {"type": "object"})  # NOTE: the first request's one-time costs
            for phase in ("cold", "warm"):
                times, statuses = [], {}
                for schema in schemas:
                    status, ms = _send(server.url, schema)
                    statuses[str(status)] = statuses.get(str(status), 0) + 1
                    if status == 200:
                        times.append(ms)
                out[phase] = {**_pcts(times), "statuses": statuses}
        finally:
            server.stop()
    print(json.dumps({**stamp(), **out}))


if __name__ == "__main__":
    main()
