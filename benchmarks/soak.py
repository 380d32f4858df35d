"""Soak: the bad-input corpus plus valid traffic (:mod:`soak_corpus`), shuffled and sent by a few
concurrent clients round after round for N minutes, with a small Batch API job each round.

Reports status counts, requests that got a status they should not have (5xx above all),
connection errors, engine restarts (``/metrics``), the resident memory of the API and engine
processes over time (``/metrics``: ``process_resident_memory_bytes`` and
``grammarserve_engine_process_resident_memory_bytes``) and whether every batch line was answered
exactly once. Prints one JSON line.

    python benchmarks/soak.py --minutes 10                 # starts its own server
    python benchmarks/soak.py --minutes 10 --url http://127.0.0.1:8000   # an existing one

The first round is the warm-up (caches fill); RSS growth is reported from its end.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serverproc import ROOT, ServerProcess, metrics, request
from soak_corpus import CHAT, Case, cases, chat

_API_RSS = "process_resident_memory_bytes"
_ENGINE_RSS = "grammarserve_engine_process_resident_memory_bytes"
_RESTARTS = "grammarserve_engine_restarts_total"
_BATCH_LINES = 4


def send(base: str, case: Case, timeout: float = 300) -> tuple[int, str]:
    """Send one case; its status (0: the connection failed) and the start of the reply."""
    u = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=timeout)
    headers = {"Content-Type": "application/json", **case.headers}
    data = case.raw if case.raw is not None else (
        json.dumps(case.body).encode() if case.body is not None else None)
    try:
        if case.chunked and data is not None:
            chunks = (data[i:i + 65536] for i in range(0, len(data), 65536))
            conn.request(case.method, case.path, body=chunks, headers=headers,
                         encode_chunked=True)
        elif "Content-Length" in headers:  # a declared length the body does not have
            conn.putrequest(case.method, case.path)
            for k, v in headers.items():
                conn.putheader(k, v)
            conn.endheaders(data)
        else:
            conn.request(case.method, case.path, body=data, headers=headers)
        r = conn.getresponse()
        text = r.read(64) if case.abort else r.read()  # abort: the first event, then hang up
        return int(r.status), text[:300].decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as e:
        return 0, f"{type(e).__name__}: {e}"
    finally:
        conn.close()


class Batches:
    """One small Batch API job per round; at the end, were all lines answered once?"""

    def __init__(self, base: str) -> None:
        self.base = base
        self.ids: list[str] = []

    def start(self, round_: int) -> None:
        lines = "".join(json.dumps({"custom_id": f"r{round_}-{i}", "method": "POST",
                                    "url": CHAT, "body": chat(f"Item {i}: a word.")}) + "\n"
                        for i in range(_BATCH_LINES))
        body = (b'--S\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--S\r\n'
                b'Content-Disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n'
                + lines.encode() + b"\r\n--S--\r\n")
        status, f = request("POST", self.base + "/v1/files", raw=body,
                            headers={"Content-Type": "multipart/form-data; boundary=S"})
        if status != 200:
            return
        status, b = request("POST", self.base + "/v1/batches", {
            "input_file_id": f["id"], "endpoint": CHAT, "completion_window": "24h"})
        if status == 200:
            self.ids.append(b["id"])

    def finish(self, timeout: float) -> dict[str, Any]:
        """Wait (bounded) for every batch; how many completed with each line exactly once."""
        deadline = time.monotonic() + timeout
        exact = 0
        statuses: Counter[str] = Counter()
        for bid in self.ids:
            b: Any = {}
            while time.monotonic() < deadline:
                _, b = request("GET", f"{self.base}/v1/batches/{bid}")
                if isinstance(b, dict) and b.get("status") in ("completed", "failed",
                                                               "cancelled"):
                    break
                time.sleep(1)
            statuses[str(b.get("status") if isinstance(b, dict) else "unknown")] += 1
            if isinstance(b, dict) and b.get("output_file_id"):
                _, text = request("GET", f"{self.base}/v1/files/{b['output_file_id']}/content")
                ids = [json.loads(x)["custom_id"] for x in str(text).splitlines()]
                exact += len(ids) == len(set(ids)) == _BATCH_LINES
        return {"batches": len(self.ids), "statuses": dict(statuses),
                "every_line_once": exact}


class Sampler(threading.Thread):
    """RSS of both processes and the restart counter, every ``every_s`` seconds."""

    def __init__(self, base: str, every_s: float) -> None:
        super().__init__(daemon=True)
        self.base, self.every_s = base, every_s
        self.t0 = time.monotonic()
        self.series: list[tuple[float, float, float]] = []  # (s, api MB, engine MB)
        self.stop = threading.Event()

    def sample(self) -> dict[str, float]:
        m = metrics(self.base)
        if _API_RSS in m:
            self.series.append((round(time.monotonic() - self.t0, 1),
                                round(m[_API_RSS] / 2**20, 1),
                                round(m.get(_ENGINE_RSS, 0.0) / 2**20, 1)))
        return m

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            self.sample()


def _rss(series: list[tuple[float, float, float]], col: int, warm_s: float) -> dict[str, Any]:
    vals = [row[col] for row in series if row[col] > 0]
    warm = [row[col] for row in series if row[0] >= warm_s and row[col] > 0]
    if not vals:
        return {}
    after = warm[0] if warm else vals[-1]
    return {"start": vals[0], "after_warmup": after, "end": vals[-1], "max": max(vals),
            "growth_after_warmup": round(vals[-1] - after, 1)}


def soak(base: str, *, minutes: float = 0.0, rounds: int = 0, workers: int = 4,
         sample_s: float = 10.0, seed: int = 0, batch_wait_s: float = 900) -> dict[str, Any]:
    """Run rounds of the corpus until ``minutes`` passed (and at least ``rounds`` rounds ran);
    the report."""
    corpus = cases()
    rng = random.Random(seed)
    sampler = Sampler(base, sample_s)
    first = sampler.sample()
    sampler.start()
    counts: Counter[str] = Counter()
    unexpected: Counter[str] = Counter()
    examples: dict[str, str] = {}  # the first reply of each unexpected (case, status)
    batches = Batches(base)
    t0 = time.monotonic()
    warm_s = 0.0
    done = 0
    with ThreadPoolExecutor(workers) as pool:
        while done < max(rounds, 1) or time.monotonic() - t0 < minutes * 60:
            batches.start(done)
            order = rng.sample(corpus, len(corpus))
            for case, (status, text) in zip(order, pool.map(lambda c: send(base, c), order)):
                counts[str(status)] += 1
                if status not in case.expect:
                    unexpected[f"{case.name}:{status}"] += 1
                    examples.setdefault(f"{case.name}:{status}", text)
            done += 1
            if done == 1:
                warm_s = time.monotonic() - sampler.t0
                sampler.sample()
    wall = time.monotonic() - t0
    batch_report = batches.finish(batch_wait_s)
    sampler.stop.set()
    last = sampler.sample()
    five = sum(n for s, n in counts.items() if s.startswith("5"))
    return {
        "benchmark": "soak", "minutes": round(wall / 60, 2), "rounds": done,
        "corpus_cases": len(corpus), "requests": sum(counts.values()), "workers": workers,
        "status_counts": dict(sorted(counts.items())), "5xx": five,
        "connection_errors": counts.get("0", 0), "unexpected": dict(sorted(unexpected.items())),
        "unexpected_examples": dict(sorted(examples.items())),
        "engine_restarts": (last.get(_RESTARTS, float("nan")) - first.get(_RESTARTS, 0.0)
                            if last else None),
        "server_answering": bool(last), "batch": batch_report,
        "rss_mb": {"api": _rss(sampler.series, 1, warm_s),
                   "engine": _rss(sampler.series, 2, warm_s)},
        "rss_series_mb": sampler.series, "head": _head(),
    }


def _head() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=False,
                         capture_output=True, text=True)
    return out.stdout.strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=1, help="at least this many rounds")
    p.add_argument("--workers", type=int, default=4, help="concurrent clients")
    p.add_argument("--url", default=None, help="an existing server (default: start one)")
    p.add_argument("--sample-s", type=float, default=10.0, help="RSS sampling period")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--server-args", default="--kv-cache-tokens 16384 --max-num-reqs 16",
                   help="extra arguments of the server this script starts")
    args = p.parse_args()

    def run(url: str) -> dict[str, Any]:
        return soak(url, minutes=args.minutes, rounds=args.rounds, workers=args.workers,
                    sample_s=args.sample_s, seed=args.seed)

    if args.url:
        print(json.dumps(run(args.url.rstrip("/"))), flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        srv = ServerProcess(Path(tmp) / "server.log", "--data-dir", str(Path(tmp) / "data"),
                            *args.server_args.split())
        srv.start()
        try:
            report = run(srv.url)
            report["server_alive"] = srv.proc is not None and srv.proc.poll() is None
        finally:
            code = srv.stop()
        report["server_exit_code"] = code
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
