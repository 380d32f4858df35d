"""Crash containment for the grammar backends (issue 33): which compiles were running when a
process died, so a constraint that crashed a backend natively (a SIGSEGV cannot be caught) is
refused from then on instead of killing every engine that compiles it again.

A :class:`CrashJournal` is a folder. Around each backend compile the compiling process writes a
file naming the spec's digest under ``running/`` and removes it when the compile returns (or
raises). Files left there name the compiles in progress when the process died: whoever sees the
death (the server's engine client) calls :meth:`CrashJournal.collect`, which moves their
digests into the ``crashed`` list; a compiler opened on the folder refuses those digests from
memory (:meth:`CrashJournal.crashed`). Writing the file costs one small write and one unlink
per cold compile (no fsync: the kernel keeps what a crashed process wrote).

The digest names a :class:`~grammarserve.fsm.config.GrammarSpec` alone (kind, source, options,
checks), so the process that sent the request can compute it too: one journal serves one
tokenizer and backend setting (one server).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from grammarserve.fsm.config import GrammarSpec

#: What a request whose constraint crashed a backend (or one identical to it) is told.
CRASHED_MESSAGE = ("this constraint crashed the grammar backend while it compiled, so it is "
                   "refused; rewrite it (bounds, patterns) or report it")
#: Digests kept in the ``crashed`` list at most (the oldest are forgotten first).
MAX_CRASHED = 4096


def spec_digest(spec: GrammarSpec) -> str:
    """The journal's name for ``spec`` (hex, 32 characters)."""
    return hashlib.sha256(spec.key("", "").encode()).hexdigest()[:32]


class CrashJournal:
    """The journal in ``folder`` (created if missing)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._running = self.folder / "running"
        self._running.mkdir(parents=True, exist_ok=True)
        self._crashed_file = self.folder / "crashed"

    @contextlib.contextmanager
    def running(self, digest: str) -> Iterator[None]:
        """Journal ``digest`` as being compiled for the duration of the block."""
        path = self._running / f"{digest}.{os.getpid()}.{threading.get_ident()}"
        path.write_text(digest)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                path.unlink()

    def collect(self) -> list[str]:
        """The digests of the compiles a dead process left running, moved into the crashed
        list (call it once the process is gone)."""
        found: list[str] = []
        for path in sorted(self._running.iterdir()):
            with contextlib.suppress(OSError):
                digest = path.read_text().strip()
                path.unlink()
                if digest and digest not in found:
                    found.append(digest)
        if found:
            kept = [d for d in self._read() if d not in found] + found
            tmp = self._crashed_file.with_suffix(".tmp")
            tmp.write_text("".join(d + "\n" for d in kept[-MAX_CRASHED:]))
            tmp.replace(self._crashed_file)
        return found

    def crashed(self) -> frozenset[str]:
        """The digests of the specs that were compiling when a process died."""
        return frozenset(self._read())

    def _read(self) -> list[str]:
        try:
            text = self._crashed_file.read_text()
        except FileNotFoundError:
            return []
        return [line for line in text.split("\n") if line]
