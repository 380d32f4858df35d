"""Engine deaths and stalls at each phase of a request: SIGSEGV, SIGKILL and SIGSTOP of the
engine process while it compiles a grammar, while it decodes and during a long prefill.

For each (signal, phase) and each repetition the script puts the engine in that phase, signals
its pid, and records for every in-flight request its status and the seconds from the signal to
its answer (a client waits ``--answer-timeout-s``; past that the request counts as unanswered;
beside the phase's request a bystander, a plain 200-token request sent just before, is in flight),
then the seconds until the engine is back (a new engine pid and ``/health`` 200), then whether
requests are served again:

- compile: a cold ``json_schema`` request (``schemas/realworld/semgrep.json`` plus a property
  naming the repetition, so each one compiles: about 0.5 s on the embedded tokenizer), signalled
  once its crash-journal entry (``<data_dir>/grammar-crashes/running/<digest>.<engine pid>...``)
  appears;
- decode: a streamed plain chat request (``max_tokens`` 200, ``ignore_eos``), signalled once
  its first token arrived;
- prefill: a ~6,000-token prompt (unique per repetition, so no prefix is cached; the server
  runs with ``--max-batch-tokens 8192``: one step), signalled once the server counts it in
  flight.

Afterwards the same request is sent again and an innocent schema (:data:`INNOCENT`) is sent; a
refusal naming the crashed grammar backend is expected only for the compile phase under
SIGSEGV/SIGKILL (the journal saw that schema compiling when the engine died) and is counted
as ``wrongly_refused`` everywhere else. A stopped engine that is still stopped when its
requests time out is SIGKILLed by the script (``manual_kills``) so the run can go on.
Prints one JSON line::

    nice .venv/bin/python benchmarks/bench_faults.py [--reps 20] [--signals SEGV,KILL,STOP]
        [--phases compile,decode,prefill] [--url http://127.0.0.1:8000 --data-dir DIR]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import stamp
from serverproc import ROOT, ServerProcess, metrics, request

CHAT = "/v1/chat/completions"
CRASHED = "crashed the grammar backend"
SLOW_SCHEMA = json.loads((ROOT / "schemas" / "realworld" / "semgrep.json").read_text())["schema"]
INNOCENT = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                             "age": {"type": "integer"}},
            "required": ["name", "age"], "additionalProperties": False}
SERVER_ARGS = ("--kv-cache-tokens 16384 --max-batch-tokens 8192 --no-grammar-disk-cache "
               "--engine-restart-backoff 0.2 --engine-restart-window 1 "
               "--engine-max-restarts 5")
SIGNALS = {"SEGV": signal.SIGSEGV, "KILL": signal.SIGKILL, "STOP": signal.SIGSTOP}


@dataclass
class Outcome:
    """One in-flight request: its status (0: none), how it ended, when (monotonic)."""

    status: int = 0
    end: str = "unanswered"  # "done", "error_event", "closed", "conn_error", "unanswered"
    at: float = 0.0
    text: str = ""
    first_token: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)


def _send(base: str, body: dict[str, Any], out: Outcome, timeout_s: float) -> None:
    """POST ``body`` to the chat endpoint and fill ``out`` (streams are read to their end)."""
    u = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=timeout_s)
    try:
        conn.request("POST", CHAT, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        out.status = r.status
        if not body.get("stream") or r.status != 200:
            out.text = r.read().decode("utf-8", "replace")
            out.end = "done"
            return
        out.end = "closed"
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if line == "data: [DONE]":
                out.end = "done"
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                if "error" in event:
                    out.end, out.text = "error_event", line[:300]
                elif any(c.get("delta", {}).get("content") for c in event.get("choices", [])):
                    out.first_token.set()
    except TimeoutError:
        out.end = "unanswered"
    except (OSError, http.client.HTTPException) as e:
        out.end, out.text = "conn_error", f"{type(e).__name__}: {e}"
    finally:
        out.at = time.monotonic()
        conn.close()
        out.finished.set()
        out.first_token.set()


def _start(base: str, body: dict[str, Any], timeout_s: float) -> Outcome:
    out = Outcome()
    threading.Thread(target=_send, args=(base, body, out, timeout_s), daemon=True).start()
    return out


def _chat(content: str, max_tokens: int, schema: dict[str, Any] | None = None,
          **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "temperature": 0, "max_tokens": max_tokens,
                            "messages": [{"role": "user", "content": content}], **extra}
    if schema is not None:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "s", "schema": schema}}
    return body


def _slow_schema(tag: str) -> dict[str, Any]:
    """The semgrep schema with one more property, named after ``tag``: a cold compile."""
    s = json.loads(json.dumps(SLOW_SCHEMA))
    s.setdefault("properties", {})[f"rep_{tag}"] = {"type": "integer"}
    return dict(s)


def _long_prompt(tag: str) -> str:
    """About 6,000 tokens of the embedded tokenizer, starting with ``tag`` (no cached prefix)."""
    return f"Run {tag}. " + " ".join(
        f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(430))


def _wait(pred: Any, timeout_s: float, every_s: float = 0.005) -> Any:
    """``pred()``'s first truthy value within ``timeout_s`` (None after it)."""
    deadline, pause = time.monotonic() + timeout_s, threading.Event()
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        pause.wait(every_s)
    return None


def engine_pid(port: int) -> int | None:
    """The engine process of the server listening on ``port``: the child running
    ``spawn_main`` of the process that owns the listening socket."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{cols[9]}]")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            owns = any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir())
        except OSError:
            continue
        if owns:
            return _spawn_child(int(proc.name))
    return None


def _spawn_child(pid: int) -> int | None:
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            try:
                if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return int(child)
            except OSError:
                continue
    return None


def _state(pid: int) -> str:
    """The process's state letter in ``/proc/<pid>/stat`` ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


@dataclass
class Rep:
    """What one repetition measured."""

    answers: list[Outcome]
    signalled_at: float
    back_up_s: float | None
    manual_kill: bool
    resend: tuple[int, str]
    innocent: tuple[int, str]
    reached_phase: bool


def _put_in_phase(base: str, phase: str, tag: str, pid: int, journal: Path,
                  timeout_s: float) -> tuple[Outcome, dict[str, Any], bool]:
    """Send the phase's request and wait until the engine is in that phase (the bystander,
    a plain request of 200 tokens sent just before, decodes meanwhile); the request's
    outcome, its body (resent afterwards) and whether the phase was reached."""
    if phase == "compile":
        body = _chat("Describe a semgrep rule in JSON.", 16, _slow_schema(tag))
        out = _start(base, body, timeout_s)
        seen = _wait(lambda: any(p.name.split(".")[1] == str(pid)
                                 for p in journal.glob("*.*.*")) or out.finished.is_set(), 60)
        return out, body, bool(seen) and not out.finished.is_set()
    if phase == "decode":
        body = _chat(f"Tell a long story about {tag}.", 200, stream=True, ignore_eos=True)
        out = _start(base, body, timeout_s)
        out.first_token.wait(120)
        return out, {**body, "stream": False, "max_tokens": 8}, not out.finished.is_set()
    body = _chat(_long_prompt(tag) + "\nSummarise.", 8)
    out = _start(base, body, timeout_s)
    seen = _wait(lambda: metrics(base).get("grammarserve_requests_in_flight", 0) >= 1, 60)
    return out, body, bool(seen) and not out.finished.is_set()


def one_rep(base: str, port: int, journal: Path, sig: str, phase: str, tag: str,
            answer_timeout_s: float, resend_timeout_s: float) -> Rep:
    """Signal the engine in ``phase``; measure answers, recovery and what is served after."""
    pid = _wait(lambda: engine_pid(port), 120, 0.2)
    assert pid is not None, "no engine process"
    bystander = _start(base, _chat(f"Count to a hundred ({tag}).", 200, ignore_eos=True),
                       answer_timeout_s)
    out, body, reached = _put_in_phase(base, phase, tag, pid, journal, answer_timeout_s)
    os.kill(pid, SIGNALS[sig])
    at = time.monotonic()
    in_flight = [o for o in (out, bystander) if not o.finished.is_set()]
    for o in in_flight:
        o.finished.wait(max(0.0, at + answer_timeout_s + 5 - time.monotonic()))
    manual = False
    if sig == "STOP" and _state(pid) == "T":  # still stopped: nobody noticed the stall
        os.kill(pid, signal.SIGKILL)
        manual = True
    back = _wait(lambda: engine_pid(port) not in (None, pid)
                 and request("GET", base + "/health", timeout=5)[0] == 200, 300, 0.05)
    back_s = round(time.monotonic() - at, 2) if back else None
    again = request("POST", base + CHAT, body, timeout=resend_timeout_s)
    innocent = request("POST", base + CHAT, _chat("Invent a person.", 24, INNOCENT),
                       timeout=resend_timeout_s)
    return Rep(in_flight, at, back_s, manual, (again[0], json.dumps(again[1])[:300]),
               (innocent[0], json.dumps(innocent[1])[:300]), reached)


def summarise(sig: str, phase: str, reps: list[Rep], answer_timeout_s: float) -> dict[str, Any]:
    """The per-(signal, phase) figures of the JSON line."""
    answers = [(o, r.signalled_at) for r in reps for o in r.answers]
    answered = [o for o, _ in answers if o.end != "unanswered"]
    secs = [round(o.at - at, 2) for o, at in answers if o.end != "unanswered"]
    backs = [r.back_up_s for r in reps if r.back_up_s is not None]
    expect_refusal = phase == "compile" and sig in ("SEGV", "KILL")
    wrong = refused_ok = 0
    for r in reps:
        for status, text in (r.resend, r.innocent):
            if status == 400 and CRASHED in text:
                wrong += 1
        if expect_refusal and r.resend[0] == 400 and CRASHED in r.resend[1]:
            wrong, refused_ok = wrong - 1, refused_ok + 1
    return {
        "signal": sig, "phase": phase, "reps": len(reps),
        "reached_phase": sum(r.reached_phase for r in reps),
        "in_flight": len(answers), "answered": len(answered),
        "answered_within_30s": sum(s <= 30 for s in secs),
        "max_answer_s": max(secs, default=None),
        "5xx": sum(o.status >= 500 or o.end == "error_event" for o in answered),
        "ends": dict(Counter(f"{o.status}:{o.end}" for o, _ in answers)),
        "back_up_s_p50": statistics.median(backs) if backs else None,
        "back_up_s_max": max(backs, default=None), "not_back": len(reps) - len(backs),
        "manual_kills": sum(r.manual_kill for r in reps),
        "resend_statuses": dict(Counter(str(r.resend[0]) for r in reps)),
        "innocent_statuses": dict(Counter(str(r.innocent[0]) for r in reps)),
        "wrongly_refused": wrong, "refused_as_compiling_at_death": refused_ok,
        "answer_timeout_s": answer_timeout_s,
    }


def run(base: str, port: int, data_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    journal = data_dir / "grammar-crashes" / "running"
    rows = []
    t0 = time.monotonic()
    for sig in args.signals.split(","):
        for phase in args.phases.split(","):
            reps = [one_rep(base, port, journal, sig, phase, f"{sig}-{phase}-{i}-{time.time()}",
                            args.answer_timeout_s, args.resend_timeout_s)
                    for i in range(args.reps)]
            rows.append(summarise(sig, phase, reps, args.answer_timeout_s))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return {"bench": "faults", "reps": args.reps, "minutes": round((time.monotonic() - t0) / 60,
                                                                   1), "results": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--signals", default="SEGV,KILL,STOP")
    p.add_argument("--phases", default="compile,decode,prefill")
    p.add_argument("--answer-timeout-s", type=float, default=60.0,
                   help="a client waits this long; past it the request is unanswered")
    p.add_argument("--resend-timeout-s", type=float, default=600.0,
                   help="how long the requests sent after the engine is back may take")
    p.add_argument("--url", default=None, help="an existing server on this machine "
                   "(default: start one); give its --data-dir too")
    p.add_argument("--data-dir", default=None, help="the --url server's --data-dir")
    p.add_argument("--server-args", default=SERVER_ARGS,
                   help="extra arguments of the server this script starts")
    args = p.parse_args()
    if args.url:
        if not args.data_dir:
            p.error("--url needs the server's --data-dir (its crash journal is there)")
        base = args.url.rstrip("/")
        port = urllib.parse.urlsplit(base).port or 80
        print(json.dumps({**stamp(), **run(base, port, Path(args.data_dir), args)}), flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="faults-") as tmp:
        data = Path(tmp) / "data"
        srv = ServerProcess(Path(tmp) / "server.log", "--data-dir", str(data),
                            *args.server_args.split())
        srv.start()
        try:
            report = run(srv.url, srv.port, data, args)
            report["server_alive"] = srv.proc is not None and srv.proc.poll() is None
        finally:
            srv.stop()
        report["server_args"] = args.server_args
        print(json.dumps({**stamp(), **report}), flush=True)


if __name__ == "__main__":
    main()
