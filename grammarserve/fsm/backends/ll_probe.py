"""A large llguidance grammar is built first in a child process that can be killed.

llguidance's parse of a grammar cannot be stopped once started, and runs before any of its
``ParserLimits`` applies: a structural tag of 3,000 triggers made a 120 MB grammar whose parse
took the engine from 7 to 23 GB within a minute, its compile written off by the timeout but
still running. ``LLGuidanceBackend`` bounds the grammars it builds (``max_backend_grammar_bytes``)
and builds each one over ``probe_bytes`` here first (``ll_probe_child.py``, a persistent child
that holds its own copy of the tokenizer): under ``probe_memory_bytes`` of address space and
killed at the compile timeout, so a grammar whose build would take longer or more memory is
refused and costs the engine nothing. One that passes is then built in the engine, at about the
cost the probe measured. Grammars of ``probe_bytes`` or less (every ordinary schema) are never
probed, so the common path is unchanged.
"""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from grammarserve.errors import GrammarBackendError, GrammarTimeoutError
from grammarserve.fsm.backends import ll_probe_child
from grammarserve.fsm.deadlines import Deadline

#: Longest wait for the child to start (it builds the tokenizer's trie, ~0.5 s).
_START_S = 60.0
#: How often a wait for the child reads its deadline again.
_SLICE_S = 0.1


class LLProbe:
    """One child process that builds llguidance grammars; see the module docstring.

    ``setup`` gives the child's tokenizer and limits (``{"tokenizer": <JSON>, "n_vocab",
    "eos", "limits": {LLParserLimits keywords}}``); it is called when the child starts."""

    def __init__(self, setup: Callable[[], dict[str, Any]], memory_bytes: int) -> None:
        self._setup = setup
        self.memory_bytes = memory_bytes
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None

    def check(self, grammar: str, deadline: Deadline | float) -> str | None:
        """llguidance's refusal of ``grammar`` (None: it builds, with its first mask).
        Raises ``GrammarTimeoutError`` past ``deadline`` (a :class:`Deadline`, re-read while
        the child builds, or seconds from now): the child is killed (none is asked past it),
        and ``GrammarBackendError`` when the build took more memory than the bound."""
        due = deadline if isinstance(deadline, Deadline) else Deadline(
            time.monotonic() + deadline)
        if due.left() <= 0 or not self._lock.acquire(timeout=due.left()):
            raise _timeout()
        try:
            proc = self._started()
            try:
                _send(proc, grammar.encode("utf-8"))
                answer = _receive(proc, due)
            except TimeoutError:
                self._kill()
                raise _timeout() from None
            except (OSError, EOFError):
                self._kill()
                raise GrammarBackendError(
                    "llguidance could not build this grammar within this server's memory limit "
                    f"of {self.memory_bytes:,} bytes (probe_memory_bytes); use fewer or smaller "
                    "schemas", backend="llguidance") from None
            error: str | None = answer["error"]
            return error
        finally:
            self._lock.release()

    def close(self) -> None:
        """Stop the child (a later check starts a new one)."""
        with self._lock:
            self._kill()

    @property
    def pid(self) -> int | None:
        """The child's process id, while it runs."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def _started(self) -> subprocess.Popen[bytes]:
        # Called with the lock held.
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._proc = subprocess.Popen(
            [sys.executable, "-I", ll_probe_child.__file__, str(self.memory_bytes)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        # NOTE: a probe dropped with its backend (a closed compiler) takes its child with it
        weakref.finalize(self, _reap, self._proc)
        try:
            _send(self._proc, json.dumps(self._setup()).encode("utf-8"))
            _receive(self._proc, Deadline(time.monotonic() + _START_S))
        except (TimeoutError, OSError, EOFError):
            self._kill()
            raise GrammarBackendError(
                "llguidance's probe process did not start (over probe_memory_bytes, "
                f"{self.memory_bytes:,} bytes?)", backend="llguidance") from None
        return self._proc

    def _kill(self) -> None:
        # Called with the lock held.
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def _reap(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _timeout() -> GrammarTimeoutError:
    return GrammarTimeoutError("llguidance could not build this grammar within the compile "
                               "timeout (compile_timeout_s), or every request waiting for it "
                               "left; its build was stopped; use fewer or smaller schemas")


def _send(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None
    proc.stdin.write(struct.pack(">I", len(data)) + data)
    proc.stdin.flush()


def _receive(proc: subprocess.Popen[bytes], deadline: Deadline) -> dict[str, Any]:
    """The child's next message; ``TimeoutError`` past ``deadline``, ``EOFError`` if it
    ended (an allocation over its bound aborts it)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    head = _read_exact(fd, 4, deadline)
    body = _read_exact(fd, struct.unpack(">I", head)[0], deadline)
    answer: dict[str, Any] = json.loads(body)
    return answer


def _read_exact(fd: int, size: int, deadline: Deadline) -> bytes:
    chunks: list[bytes] = []
    while size > 0:
        left = deadline.left()
        if left <= 0:
            raise TimeoutError
        # NOTE: the deadline may move (an abandoned compile), so it is read again each slice
        if not select.select([fd], [], [], min(left, _SLICE_S))[0]:
            continue
        chunk = os.read(fd, size)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)
