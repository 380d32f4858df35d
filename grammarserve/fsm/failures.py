"""Failures the grammar layer survives on purpose, each logged and counted.

Some work is optional: a background upgrade to a faster backend, a disk cache write, a
jump-forward span, rewriting a schema's ``$id``-relative references, the crash journal. When it
fails the caller goes on without it (the request is served all the same), but the failure must
not vanish: :meth:`FailureLog.report` counts it by :class:`Failure` kind and logs it, at most one
record of each message every ``interval_s`` (a failure that repeats per token or per request
cannot flood the log; the next record says how many were left out). The counts reach the engine's
stats (``EngineStats.grammar_*_failures``, ``engine/stats.py``).

NOTE: one process-wide :data:`FAILURES`, like the ``logging`` tree it writes to: the failures
happen in leaf code (a matcher, a schema reader) that holds no context object. It is created
once; tests read counts before and after, or call :meth:`FailureLog.reset`.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass


class Failure(enum.Enum):
    """What failed (each kind has its own counter)."""

    UPGRADE = "upgrade"  # a background compile for an upgrade (or a per-style grammar)
    DISK_WRITE = "disk_write"  # serializing or writing a grammar to the disk cache
    FORCED_TOKENS = "forced_tokens"  # a matcher's jump-forward span (none is fed instead)
    LOCAL_REFS = "local_refs"  # reading a schema's ids (its refs are left to the front end)
    JOURNAL = "journal"  # the crash journal (a file not written, read or removed)


@dataclass(frozen=True)
class FailureCounts:
    """How many failures of each kind this process survived."""

    upgrade: int = 0
    disk_write: int = 0
    forced_tokens: int = 0
    local_refs: int = 0
    journal: int = 0


class FailureLog:
    """Counts failures by kind and logs them, rate-limited per message (see the module)."""

    def __init__(self, interval_s: float = 60.0) -> None:
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._counts = {kind: 0 for kind in Failure}
        self._last_logged: dict[tuple[Failure, str], float] = {}
        self._unlogged: dict[tuple[Failure, str], int] = {}

    def report(self, kind: Failure, logger: logging.Logger, level: int, msg: str,
               *args: object, exc_info: BaseException | None = None) -> None:
        """Count one failure of ``kind`` and log ``msg % args`` to ``logger`` at ``level``
        (with ``exc_info``'s traceback) unless a record of ``kind`` with this ``msg`` (the
        template, not its arguments) was logged less than ``interval_s`` ago."""
        now, key = time.monotonic(), (kind, msg)
        with self._lock:
            self._counts[kind] += 1
            last = self._last_logged.get(key)
            if last is not None and now - last < self.interval_s:
                self._unlogged[key] = self._unlogged.get(key, 0) + 1
                return
            self._last_logged[key] = now
            skipped = self._unlogged.pop(key, 0)
        if skipped:
            msg += f" ({skipped} more since the last such record)"
        logger.log(level, msg, *args, exc_info=exc_info)

    def counts(self) -> FailureCounts:
        """The counts so far."""
        with self._lock:
            return FailureCounts(**{kind.value: n for kind, n in self._counts.items()})

    def reset(self) -> None:
        """Zero the counts and the rate limits (tests)."""
        with self._lock:
            self._counts = {kind: 0 for kind in Failure}
            self._last_logged.clear()
            self._unlogged.clear()


#: The process's failure log (see the module's NOTE).
FAILURES = FailureLog()
