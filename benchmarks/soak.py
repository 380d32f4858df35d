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

``--adversarial`` is issue 33's validated soak (:func:`validated_soak`): six crash-class requests
in a row, then the bad input above, the adversarial corpus and the corpus schemas
(:mod:`soak_adversarial`, temperature 0.7) with ``--in-flight`` requests always in flight, every
200 reply with ``finish_reason: "stop"`` validated against what its request sent
(:mod:`soak_check`); it counts 5xx, 4xx, invalid stops, engine restarts and requests that never
finished, and keeps the first inputs and replies of each failure.

    python benchmarks/soak.py --adversarial --minutes 10 --in-flight 16
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import model_shapes
from machine import cpu_name, revision, stamp
from serverproc import ROOT, ServerProcess, metrics, request
from soak_adversarial import CRASH_CLASS, adversarial_cases, body, corpus_cases
from soak_check import Verdict, check
from soak_corpus import CHAT, COMPLETIONS, PERSON, Case, cases, chat
from soak_metrics import Sampler, memory_report, scrapes_report, start_scraper

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
        return int(r.status), text.decode("utf-8", "replace")
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


def soak(base: str, *, minutes: float = 0.0, rounds: int = 0, workers: int = 4,
         sample_s: float = 10.0, seed: int = 0, batch_wait_s: float = 900,
         scrape_s: float = 0.0) -> dict[str, Any]:
    """Run rounds of the corpus until ``minutes`` passed (and at least ``rounds`` rounds ran);
    the report."""
    corpus = cases()
    rng = random.Random(seed)
    sampler = Sampler(base, sample_s)
    first = sampler.sample()
    sampler.start()
    scraper = start_scraper(base, scrape_s, sampler)
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
                    examples.setdefault(f"{case.name}:{status}", text[:300])
            done += 1
            if done == 1:
                warm_s = time.monotonic() - sampler.t0
                sampler.sample()
    wall = time.monotonic() - t0
    batch_report = batches.finish(batch_wait_s)
    sampler.stop.set()
    scrapes = scrapes_report(scraper)
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
        "rss_mb": memory_report(sampler.series, warm_s),
        "rss_series_mb": sampler.series, "scrapes": scrapes, "head": _head(),
    }


def _crash_class_in_a_row(base: str, n: int = 6) -> dict[str, Any]:
    """``n`` crash-class requests one after another, then ``/health`` and a served request."""
    statuses = [send(base, Case(name, CHAT, body(CRASH_CLASS[i % len(CRASH_CLASS)][1])))[0]
                for i, name in enumerate(f"crash_{k}" for k in range(n))]
    ok = Case("after_crash_class", CHAT, body(PERSON, "Invent a person."))
    status, text = send(base, ok)
    verdict = check(ok.body, status, text)
    return {"statuses": statuses, "health_after": request("GET", base + "/health")[0],
            "served_after": status, "served_after_valid": verdict.finished
            and verdict.invalid is None}


def _note(bucket: dict[str, list[dict[str, Any]]], key: str, case: Case, status: int,
          text: str, why: str, keep: int) -> None:
    """Keep the first ``keep`` inputs and replies of a kind of failure."""
    rows = bucket.setdefault(key, [])
    if len(rows) < keep:
        sent = json.dumps(case.body) if case.body is not None else repr(case.raw)
        rows.append({"case": case.name, "status": status, "why": why,
                     "request": sent[:4000], "reply": text[:4000]})


def validated_soak(base: str, *, minutes: float, in_flight: int = 16, seed: int = 0,
                   sample_s: float = 10.0, timeout_s: float = 300,
                   batch_wait_s: float = 900, keep: int = 5, scrape_s: float = 0.0
                   ) -> dict[str, Any]:
    """Issue 33's soak: six crash-class requests in a row, then the bad-input corpus, the
    adversarial corpus and the corpus schemas (temperature 0.7) shuffled round after round,
    ``in_flight`` requests always in flight, for ``minutes``; every 200 with ``finish_reason``
    "stop" validated against what its request sent (:mod:`soak_check`)."""
    first, rev, started = metrics(base), revision(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
    preamble = _crash_class_in_a_row(base)
    corpus = cases() + adversarial_cases() + corpus_cases()
    healthy = {c.name for c in corpus if c.valid}
    rng = random.Random(seed)
    sampler = Sampler(base, sample_s)
    sampler.start()
    scraper = start_scraper(base, scrape_s, sampler)
    batches = Batches(base)
    counts: Counter[str] = Counter()
    tally: Counter[str] = Counter()
    unexpected: Counter[str] = Counter()
    invalid: Counter[str] = Counter()  # invalid stops per case
    seen: dict[str, list[dict[str, Any]]] = {}
    t0 = time.monotonic()
    order: list[Case] = []
    rounds = 0

    def next_case() -> Case:
        nonlocal order, rounds
        if not order:
            batches.start(rounds)
            order, rounds = rng.sample(corpus, len(corpus)), rounds + 1
        return order.pop()

    def record(case: Case, status: int, text: str) -> None:
        counts[str(status)] += 1
        # an aborted stream was hung up on after its first bytes: nothing to judge
        verdict = Verdict(status == 200) if case.abort else check(case.body, status, text)
        tally["stops_validated"] += verdict.stops
        if status not in case.expect:
            unexpected[f"{case.name}:{status}"] += 1
            _note(seen, "unexpected", case, status, text, f"not {sorted(case.expect)[:3]}...",
                  keep)
        if status >= 500:
            _note(seen, "5xx", case, status, text, "5xx", keep)
        elif status == 0:
            kind = "timeouts" if "timed out" in text.lower() else "connection_errors"
            tally[kind] += 1
            _note(seen, kind, case, status, text, kind, keep)
        if verdict.invalid:
            tally["invalid_stop"] += 1
            invalid[case.name] += 1
            _note(seen, "invalid_stop", case, status, text, verdict.invalid, keep)
        for kind, why in (("unverifiable", verdict.unverifiable),
                          ("stream_errors", verdict.stream_error),
                          ("float_disagreements", verdict.float_disagreement)):
            if why:
                tally[kind] += 1
                _note(seen, kind, case, status, text, why, keep)
        if case.name in healthy:
            tally["healthy_sent"] += 1
            tally["healthy_finished"] += status == 200 and (
                verdict.finished or case.abort or case.path not in (CHAT, COMPLETIONS))
        elif status == 200:
            tally["adversarial_served"] += case.name.startswith(("adv_", "crash_", "tool_",
                                                                 "regex_"))

    with ThreadPoolExecutor(in_flight) as pool:
        running: dict[Future[tuple[int, str]], Case] = {}
        while running or time.monotonic() - t0 < minutes * 60:
            while len(running) < in_flight and time.monotonic() - t0 < minutes * 60:
                case = next_case()
                running[pool.submit(send, base, case, timeout_s)] = case
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                record(running.pop(fut), *fut.result())
    wall = time.monotonic() - t0
    batch_report = batches.finish(batch_wait_s)
    sampler.stop.set()
    scrapes = scrapes_report(scraper)
    last = sampler.sample()
    restarts = last.get(_RESTARTS, float("nan")) - first.get(_RESTARTS, 0.0) if last else None
    return {
        "benchmark": "soak_adversarial", "revision": rev, "revision_at_end": revision(),
        "cpu": cpu_name(), "started": started,
        "minutes": round(wall / 60, 2), "in_flight": in_flight, "rounds": rounds,
        "corpus_cases": len(corpus), "healthy_cases": len(healthy),
        "crash_class_in_a_row": preamble, "requests": sum(counts.values()),
        "status_counts": dict(sorted(counts.items())),
        "5xx": sum(n for s, n in counts.items() if s.startswith("5")),
        "4xx": sum(n for s, n in counts.items() if s.startswith("4")),
        "engine_restarts": restarts, "server_answering": bool(last),
        "invalid_stop": tally["invalid_stop"], "stops_validated": tally["stops_validated"],
        "timeouts": tally["timeouts"], "connection_errors": tally["connection_errors"],
        "healthy_sent": tally["healthy_sent"], "healthy_finished": tally["healthy_finished"],
        "adversarial_served": tally["adversarial_served"],
        "invalid_stop_cases": dict(sorted(invalid.items())),
        "unverifiable": tally["unverifiable"], "stream_errors": tally["stream_errors"],
        "float_disagreements": tally["float_disagreements"],
        "unexpected": dict(sorted(unexpected.items())), "batch": batch_report,
        "rss_mb": memory_report(sampler.series, 0.0),
        "rss_series_mb": sampler.series, "scrapes": scrapes, "failures": seen,
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
    p.add_argument("--adversarial", action="store_true",
                   help="issue 33's validated soak: crash class six in a row, then the "
                        "adversarial corpus and the corpus schemas beside the bad input, at "
                        "temperature 0.7, --in-flight requests at once, every stop validated")
    p.add_argument("--in-flight", type=int, default=16, help="requests at once (--adversarial)")
    p.add_argument("--timeout-s", type=float, default=300,
                   help="a request unanswered this long never finished (--adversarial)")
    p.add_argument("--url", default=None, help="an existing server (default: start one)")
    p.add_argument("--sample-s", type=float, default=10.0, help="RSS sampling period")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scrape-every", type=float, default=0.0, metavar="S",
                   help="GET /metrics every S seconds as a Prometheus scraper would (3 s "
                        "timeout; slow and failed scrapes counted, RSS added to the series)")
    p.add_argument("--model", default=None, help="the started server's --model (a GGUF path)")
    p.add_argument("--shape", default=None, choices=sorted(model_shapes.SHAPES),
                   help="serve model_shapes.py's random-weight GGUF of this shape (made once, "
                        "then cached)")
    p.add_argument("--server-args", default="--kv-cache-tokens 16384 --max-num-reqs 16",
                   help="extra arguments of the server this script starts")
    p.add_argument("--server-log", type=Path, default=None,
                   help="keep a copy of the server's log (engine warnings included) here")
    args = p.parse_args()

    def run(url: str) -> dict[str, Any]:
        if args.adversarial:
            return validated_soak(url, minutes=args.minutes, in_flight=args.in_flight,
                                  seed=args.seed, sample_s=args.sample_s,
                                  timeout_s=args.timeout_s, scrape_s=args.scrape_every)
        return soak(url, minutes=args.minutes, rounds=args.rounds, workers=args.workers,
                    sample_s=args.sample_s, seed=args.seed, scrape_s=args.scrape_every)

    if args.url:
        print(json.dumps({**stamp(), **run(args.url.rstrip("/"))}), flush=True)
        return
    model = args.model or (str(model_shapes.make_gguf(args.shape, model_shapes.default_dir()))
                           if args.shape else None)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        log = Path(tmp) / "server.log"
        srv = ServerProcess(log, "--data-dir", str(Path(tmp) / "data"),
                            *args.server_args.split(), *(["--model", model] if model else []))
        srv.start()
        try:
            report = run(srv.url)
            report["server_alive"] = srv.proc is not None and srv.proc.poll() is None
        finally:
            code = srv.stop()
        report["server_exit_code"] = code
        report["model"] = model or "default"
        text = log.read_text(errors="replace")
        if args.server_log is not None:
            args.server_log.write_text(text)
        report["engine_deaths_logged"] = text.count("the engine process died")
        report["server_log_errors"] = [line[:300] for line in text.splitlines()
                                       if line.startswith(("ERROR", "CRITICAL"))][:20]
        report["memory_jumps_logged"] = [line[:400] for line in text.splitlines()
                                         if "engine memory grew" in line][:20]
        print(json.dumps({**stamp(), **report}), flush=True)


if __name__ == "__main__":
    main()
