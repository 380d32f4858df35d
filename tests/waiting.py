"""Waiting on an event with a deadline, for tests: never a bare ``time.sleep`` as a
synchronisation.

``wait_until(predicate, timeout_s, what)`` returns the predicate's first truthy value or raises an
``AssertionError`` naming ``what`` (and the last value seen). Where a real event exists, prefer it:
``wait_http_ok`` waits for a server's status, ``wait_lines`` for a file to hold lines, and a
predicate may raise itself (``alive(proc, log)``) to fail at once when the thing waited on died.
Between two checks the helpers wait on a private ``threading.Event`` (never set): the interval is
a polling period, not a guess at how long the work takes.
"""

from __future__ import annotations

import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout_s: float, what: str,
               interval_s: float = 0.1, detail: Callable[[], object] | None = None) -> T:
    """The first truthy value of ``predicate()``, checked every ``interval_s``.

    Raises ``AssertionError("timed out after Ns waiting for <what> ...")`` once ``timeout_s``
    has passed without one, with ``detail()`` appended when given (what was last seen); an
    exception raised by ``predicate`` propagates at once.
    """
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while True:
        value = predicate()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            seen = f"; {detail()}" if detail is not None else ""
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what} "
                                 f"(last value: {value!r}{seen})")
        pause.wait(min(interval_s, left))


def alive(proc: subprocess.Popen[bytes], log: Path | None = None) -> None:
    """Fail now (with the log's text) if ``proc`` has exited: nothing it was to do will come."""
    if proc.poll() is not None:
        text = log.read_text(errors="replace") if log is not None else ""
        raise AssertionError(f"process {proc.pid} exited with {proc.returncode}:\n{text}")


def http_status(url: str, timeout_s: float = 5) -> int | None:
    """The status ``GET url`` answers, or None when nothing answers (refused, reset, timeout)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return None


def wait_http_ok(url: str, timeout_s: float, what: str,
                 proc: subprocess.Popen[bytes] | None = None, log: Path | None = None,
                 statuses: list[int] | None = None) -> None:
    """Until ``GET url`` answers 200; fails at once if ``proc`` exits first.

    Every status answered is appended to ``statuses`` when given (no answer adds nothing).
    """
    def ok() -> bool:
        if proc is not None:
            alive(proc, log)
        status = http_status(url)
        if statuses is not None and status is not None:
            statuses.append(status)
        return status == 200

    wait_until(ok, timeout_s, what, interval_s=0.2)


def line_count(path: Path) -> int:
    """Complete lines in ``path`` (0 when it does not exist yet)."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def wait_lines(path: Path, n: int, timeout_s: float, what: str,
               proc: subprocess.Popen[bytes] | None = None, log: Path | None = None) -> int:
    """Until ``path`` holds at least ``n`` complete lines (returns the count); fails at once if
    ``proc`` exits first."""
    def enough() -> int:
        if proc is not None:
            alive(proc, log)
        count = line_count(path)
        return count if count >= n else 0

    return wait_until(enough, timeout_s, what)
