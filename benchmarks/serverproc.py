"""``grammarserve serve`` as a child process, for the soak benchmark and the end-to-end tests of
engine supervision: start it (own process group), wait for ``/health``, find its engine process,
read ``/metrics``, kill either process.

Plain ``urllib`` only, so callers need nothing beyond the standard library.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: The ``grammarserve`` console script beside this interpreter. Servers and batch runs start
#: through it, never ``python -m`` from the checkout's root, where the working directory on
#: ``sys.path`` puts ``kernels/`` in place of the ``kernels`` package transformers imports
#: (grammarserve/source_paths.py).
GRAMMARSERVE = str(Path(sys.executable).with_name("grammarserve"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def request(method: str, url: str, body: Any = None, *, raw: bytes | None = None,
            headers: dict[str, str] | None = None, timeout: float = 300
            ) -> tuple[int, Any]:
    """One HTTP request; the status and the JSON body (text if not JSON; status 0 and the error
    text if the connection failed)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    h = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(url, data=data, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read()
    except (OSError, ValueError) as e:  # refused, reset, timed out
        return 0, f"{type(e).__name__}: {e}"
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text.decode("utf-8", "replace")


def metrics(url: str) -> dict[str, float]:
    """``/metrics`` as ``{name{labels}: value}`` (comments dropped)."""
    status, text = request("GET", url + "/metrics", timeout=60)
    if status != 200 or not isinstance(text, str):
        return {}
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


class ServerProcess:
    """The server on the embedded model; ``args`` are added to its command line."""

    def __init__(self, log: Path, *args: str) -> None:
        self.log = log
        self.args = args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 600) -> None:
        """Start and wait until ``/health`` answers 200 (raises with the log if it cannot)."""
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [GRAMMARSERVE, "serve", "--model", "default",
                 "--port", str(self.port), "--num-threads", "1", "--log-level", "warning",
                 *self.args], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                start_new_session=True)
        if not self.wait_healthy(timeout):
            self.stop()
            raise RuntimeError("the server did not become healthy:\n" + self.log.read_text())

    def wait_healthy(self, timeout: float) -> bool:
        """Poll ``/health`` until 200 (True), the server exits or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            if request("GET", self.url + "/health", timeout=10)[0] == 200:
                return True
            time.sleep(0.5)
        return False

    def engine_pid(self) -> int | None:
        """The engine process (the server's multiprocessing spawn child)."""
        assert self.proc is not None
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                try:
                    cmd = Path(f"/proc/{child}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"spawn_main" in cmd:
                    return int(child)
        return None

    def kill_engine(self) -> int:
        """SIGKILL the engine process; its pid."""
        pid = self.engine_pid()
        assert pid is not None, "no engine process"
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop(self) -> int | None:
        """Terminate the server (its group, if it will not go); its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(60)
        return self.proc.returncode
