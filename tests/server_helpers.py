"""Start the real server (the ``grammarserve serve --model default`` console script) on a free
port for end-to-end tests, and plain-HTTP helpers to talk to it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from serverproc import GRAMMARSERVE
from waiting import wait_http_ok


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def http_post(url: str, body: Any, raw: bytes | None = None) -> tuple[int, Any]:
    """POST JSON; returns the status and the JSON body (or the text of a non-JSON body)."""
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            text = r.read().decode()
            return r.status, json.loads(text) if r.headers.get_content_type() == (
                "application/json") else text
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@contextmanager
def running_server(log: Path, *args: str,
                   start_timeout_s: float = 300.0) -> Iterator[dict[str, Any]]:
    """The server on the embedded model with ``args`` added to its command line.

    Yields ``{"url", "health", "log"}``: ``health`` holds the statuses ``/health`` answered
    while the server was starting (the last one is 200). The server is stopped on exit. A
    server that exits while starting fails at once; ``start_timeout_s`` only bounds a hang.
    """
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [GRAMMARSERVE, "serve", "--model", "default",
             "--port", str(port), "--num-threads", "1", "--log-level", "warning", *args],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    statuses: list[int] = []
    try:
        try:
            wait_http_ok(url + "/health", start_timeout_s, "the server to become healthy",
                         proc=proc, statuses=statuses)
        except AssertionError as e:
            pytest.fail(f"{e}\n{log.read_text()}")
        yield {"url": url, "health": statuses, "log": log}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
