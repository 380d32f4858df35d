"""The seven client paths (benchmarks/client_paths.py) x the 3 invoice documents against one
server: how many objects each path parses and their field accuracy against the documents' truth.

    .venv/bin/python benchmarks/bench_clients.py --url http://127.0.0.1:8200 [--label ours]

Prints one JSON line: revision (``git describe --dirty``), CPU, time, the server's URL and label,
and per path ``parsed`` (objects parsed of 3), ``field_accuracy`` (right fields over all checked
fields of all 3 documents: a failed parse scores 0), ``seconds``, and per document the outcome
(``ok`` with the right/checked fields, or the exception's type and start). ``--cold`` gives
every call a prefix-cache namespace of its own (see client_paths.py): without it the first path
to send a document prefills it cold and the later ones hit the cache. ``--raw DIR`` writes
each call's raw HTTP bodies to DIR/<path>-<document>.json, to read what a failure produced.
The model name is ``default`` (grammarserve and benchmarks/peers/start_vllm.sh both serve it so).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from client_paths import DOCUMENTS, PATHS, TRUTH, RawLog, checked_fields, field_scores
from machine import cpu_name, revision


def run_path(name: str, url: str, raw: Path | None, cold: str) -> dict[str, Any]:
    path = PATHS[name]
    docs: dict[str, Any] = {}
    right = checked = parsed = 0
    start = time.perf_counter()
    for doc, text in DOCUMENTS.items():
        log = RawLog()
        t0 = time.perf_counter()
        try:
            invoice = path(url + "/v1", text, log, f"{cold}-{name}-{doc}" if cold else None)
        except Exception as e:  # noqa: BLE001 -- a failed parse is the measurement
            docs[doc] = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:160]}"}
            checked += checked_fields(TRUTH[doc])
        else:
            r, n = field_scores(invoice, TRUTH[doc])
            parsed += 1
            right += r
            checked += n
            docs[doc] = {"ok": True, "fields": f"{r}/{n}"}
        docs[doc]["seconds"] = round(time.perf_counter() - t0, 2)
        if raw is not None:
            (raw / f"{name}-{doc}.json").write_text(json.dumps(
                {"requests": log.requests, "replies": log.bodies}, ensure_ascii=False, indent=1))
    return {"parsed": parsed, "of": len(DOCUMENTS),
            "field_accuracy": round(right / checked, 3) if checked else 0.0,
            "seconds": round(time.perf_counter() - start, 2), "documents": docs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the server's base URL, without /v1")
    ap.add_argument("--label", default="", help="a name for the server in the JSON line")
    ap.add_argument("--paths", default=",".join(PATHS), help="comma-separated path names")
    ap.add_argument("--raw", type=Path, help="a folder for the raw request and reply bodies")
    ap.add_argument("--cold", action="store_true",
                    help="each call in a prefix-cache namespace of its own (cache_namespace / "
                         "cache_salt): every prompt prefilled from scratch, whatever ran before")
    args = ap.parse_args(argv)
    if args.raw is not None:
        args.raw.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    cold = f"cold{time.time_ns()}" if args.cold else ""
    paths = {name: run_path(name, args.url.rstrip("/"), args.raw, cold)
             for name in args.paths.split(",")}
    print(json.dumps({
        "bench": "clients_nested", "revision": revision(), "cpu": cpu_name(), "time": started,
        "url": args.url, "label": args.label, "model": "default", "cold": args.cold,
        "parsed": sum(p["parsed"] for p in paths.values()),
        "of": sum(p["of"] for p in paths.values()), "paths": paths}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
