"""A stopped or stalled engine never hangs the server (``engine/process.py``,
``server/state.py``): ``/metrics`` and ``/health`` answer at once during a stop, ``/health``
says 503 while the engine cannot progress, a stop shorter than the stall timeout is survived
by the request it paused, and a longer one is an engine death (the request is answered, the
engine restarted, the stall counted). Real server, real signals; the waits are on the
server's own answers and ``/proc`` state."""

from __future__ import annotations

import http.client
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grammarserve.engine.liveness import process_stopped

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from serverproc import ServerProcess, metrics, request  # noqa: E402

pytestmark = [pytest.mark.model,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")]

STALL_S = 8.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path / "server.log", "--engine-stall-timeout", str(STALL_S),
                        "--engine-restart-backoff", "0.2")
    srv.start()
    yield srv
    pid = _engine_pid(srv)
    if pid and process_stopped(pid):
        os.kill(pid, signal.SIGCONT)
    srv.stop()


def _engine_pid(srv: ServerProcess) -> int:
    return int(metrics(srv.url).get("grammarserve_engine_pid", 0))


def _stop(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    for _ in range(100_000):
        if process_stopped(pid):
            return
        os.sched_yield()
    raise AssertionError(f"process {pid} did not stop")


class _Stream:
    """A streamed chat completion read event by event."""

    def __init__(self, srv: ServerProcess, max_tokens: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
        body = {"model": "default", "max_tokens": max_tokens, "temperature": 0,
                "stream": True, "messages": [{"role": "user", "content": "Tell a long story."}]}
        self.conn.request("POST", "/v1/chat/completions", json.dumps(body),
                          {"Content-Type": "application/json"})
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200

    def events(self) -> Iterator[dict[str, Any]]:
        for raw in self.resp:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[6:])

    def first_token(self) -> Iterator[dict[str, Any]]:
        it = self.events()
        for event in it:
            if event.get("choices") and event["choices"][0]["delta"].get("content"):
                return it
        raise AssertionError("the stream ended before its first token")


def _timed_get(srv: ServerProcess, path: str, timeout: float) -> tuple[int, Any, float]:
    t = time.monotonic()
    status, body = request("GET", srv.url + path, timeout=timeout)
    return status, body, time.monotonic() - t


def test_a_stop_shorter_than_the_stall_timeout_is_survived_and_scrapes_answer_during_it(
        server: ServerProcess) -> None:
    pid = _engine_pid(server)
    stream = _Stream(server, 64)
    rest = stream.first_token()
    _stop(pid)
    status, text, took = _timed_get(server, "/metrics", timeout=3)
    assert status == 200 and took < 2.5 and "grammarserve_engine_pid" in text
    status, body, took = _timed_get(server, "/health", timeout=3)
    assert status == 503 and "stopped" in body["message"] and took < 2.5
    os.kill(pid, signal.SIGCONT)
    events = list(rest)
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert request("GET", server.url + "/health", timeout=10)[0] == 200
    ok = request("POST", server.url + "/v1/chat/completions", {
        "model": "default", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
    assert ok[0] == 200 and ok[1]["choices"][0]["message"]["content"]
    m = metrics(server.url)
    assert m.get("grammarserve_engine_restarts_total") == 0
    assert m.get("grammarserve_engine_stalls_total") == 0 and _engine_pid(server) == pid


def test_a_stop_past_the_stall_timeout_is_a_death_answered_and_restarted(
        server: ServerProcess) -> None:
    pid = _engine_pid(server)
    stream = _Stream(server, 400)
    rest = stream.first_token()
    t0 = time.monotonic()
    _stop(pid)
    events = list(rest)  # ends with an error event once the engine is declared dead
    answered = time.monotonic() - t0
    assert STALL_S <= answered < 30, answered
    assert "error" in events[-1] and "stopped" in events[-1]["error"]["message"], events[-1]
    assert server.wait_healthy(300)
    assert _engine_pid(server) not in (0, pid)
    ok = request("POST", server.url + "/v1/chat/completions", {
        "model": "default", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
    assert ok[0] == 200, ok
    m = metrics(server.url)
    assert m.get("grammarserve_engine_restarts_total") == 1
    assert m.get("grammarserve_engine_stalls_total") == 1
