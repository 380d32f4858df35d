"""``/health`` reflects a dead engine at once (``engine/liveness.py``): a process with a fatal
signal pending, exiting or reaped is gone; a running or stopped one, or one with a pending
signal it handles, is not; a stopped one is told apart. The pending cases are held still with
SIGSTOP (waited for in ``/proc``), so nothing depends on timing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from grammarserve.engine.liveness import process_gone, process_stopped

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")

HANDLES_TERM = ("import signal, time\n"
                "signal.signal(signal.SIGTERM, lambda *a: None)\n"
                "print('ready', flush=True)\n"
                "time.sleep(60)\n")
PLAIN = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"


def _stop(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until the kernel reports it stopped."""
    os.kill(pid, signal.SIGSTOP)
    for _ in range(10_000):  # NOTE: each check is one /proc read; stopping takes microseconds
        if process_stopped(pid):
            return
        os.sched_yield()
    raise AssertionError(f"process {pid} did not stop")


def _child(code: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


@pytest.fixture
def plain() -> Iterator[subprocess.Popen[bytes]]:
    proc = _child(PLAIN)
    yield proc
    proc.kill()
    proc.wait()


def test_a_running_or_stopped_process_is_not_gone(plain: subprocess.Popen[bytes]) -> None:
    assert not process_gone(plain.pid) and not process_stopped(plain.pid)
    _stop(plain.pid)
    assert not process_gone(plain.pid) and process_stopped(plain.pid)
    os.kill(plain.pid, signal.SIGCONT)


def test_a_kill_is_seen_before_the_process_can_be_reaped(
        plain: subprocess.Popen[bytes]) -> None:
    _stop(plain.pid)
    os.kill(plain.pid, signal.SIGKILL)
    assert process_gone(plain.pid)  # at once, whether or not waitpid would see it yet
    plain.wait(10)
    assert process_gone(plain.pid)  # reaped


def test_a_pending_fatal_signal_counts_only_if_unhandled(
        plain: subprocess.Popen[bytes]) -> None:
    handler = _child(HANDLES_TERM)
    try:
        for proc in (plain, handler):
            _stop(proc.pid)
            os.kill(proc.pid, signal.SIGTERM)  # stays pending while stopped
        assert process_gone(plain.pid)
        assert not process_gone(handler.pid)
    finally:
        handler.kill()
        handler.wait()


def test_no_pid_tells_nothing() -> None:
    assert not process_gone(None) and not process_stopped(None)


class _Teardown:
    """An engine as ``EngineProcess`` sees it while the kernel tears its process down:
    ``waitpid`` has not reaped it, so ``alive`` is still True."""

    alive = True

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def trouble(self) -> str | None:
        return None  # its client has not noticed anything yet


def test_health_answers_503_while_a_killed_engine_is_torn_down(
        plain: subprocess.Popen[bytes]) -> None:
    from grammarserve.server.config import ServerConfig
    from grammarserve.server.state import ServerState

    state = ServerState(ServerConfig())
    state.status, state.engine = "ready", _Teardown(plain.pid)  # type: ignore[assignment]
    assert state.health() == (200, {"status": "ok"})
    _stop(plain.pid)
    os.kill(plain.pid, signal.SIGKILL)
    status, body = state.health()
    assert status == 503 and body["status"] == "restarting"
