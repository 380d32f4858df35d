"""Crash containment for the grammar backends: which compiles were running when a process died,
so a constraint that crashed a backend natively (a SIGSEGV cannot be caught) is refused from
then on instead of killing every engine that compiles it again.

A :class:`CrashJournal` is a folder. Around each backend compile the compiling process writes an
entry ``running/<digest>.<pid>.<tid>`` (``tid``: the compiling thread's kernel id) and removes
it when the compile returns (or raises). The entry holds the spec's digest, the writer's start
time, and its parent's pid and start time (the parent is the process that sees it die: the
server, for its engine). Entries left there name the compiles in progress when their process
died: whoever sees the death (the server's engine client) calls :meth:`CrashJournal.collect`
with the dead process's pid, which moves their digests into the ``crashed`` list; a compiler
opened on the folder refuses those digests from memory (:meth:`CrashJournal.crashed`).

Entries that must blame no one:

- A process that exits normally removes its own entries at interpreter exit and journals
  nothing more (compile threads are daemons: they may still be inside a compile then).
- At open, the entries whose writer and parent are both gone (a machine reboot; a server killed
  with its engine) are removed without being blamed, logged at info: nobody is left to say the
  compile killed its process. An entry of a dead writer whose parent lives stays for that parent
  to collect (two servers on one folder; a test that watches its child die).
- A process is its pid and its start time (``/proc``, Linux), so a pid reused by another
  process (after a reboot) is not taken for the writer; elsewhere the pid alone.

The journal is a safety net, so ``collect``, ``running`` and ``crashed`` never raise for what
they find on disk: an entry that is not a journal file (a directory, a FIFO, another name, bytes
that are no text) is skipped and left; an entry not written makes its compile unjournaled (the
compile goes on; logged once per journal); a ``crashed`` list that cannot be read or written is
logged, and ``collect`` still returns what it found. Each such failure is counted
(``failures.py``, ``Failure.JOURNAL``).

An entry costs one small write and one unlink per cold compile (no fsync: the kernel keeps what
a crashed process wrote).

The digest names a :class:`~grammarserve.fsm.config.GrammarSpec` alone (kind, source, options,
checks), so the process that sent the request can compute it too: one journal serves one
tokenizer and backend setting (one server).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import re
import stat
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from grammarserve.fsm.config import GrammarSpec
from grammarserve.fsm.failures import FAILURES, Failure

try:
    import fcntl
except ImportError:  # not POSIX: concurrent collectors are not serialized
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

#: What a request whose constraint crashed a backend (or one identical to it) is told.
CRASHED_MESSAGE = ("this constraint crashed the grammar backend while it compiled, so it is "
                   "refused; rewrite it (bounds, patterns) or report it")
#: Digests kept in the ``crashed`` list at most (the oldest are forgotten first).
MAX_CRASHED = 4096
#: An entry's name: ``<digest>.<pid>.<thread id>``.
_ENTRY = re.compile(r"([0-9a-f]{1,64})\.([0-9]{1,10})\.([0-9]{1,24})")
_DIGEST = re.compile(r"[0-9a-f]{1,64}")
#: Bytes of an entry read at most (its one line is ~80).
_ENTRY_BYTES = 512


def spec_digest(spec: GrammarSpec) -> str:
    """The journal's name for ``spec`` (hex, 32 characters)."""
    return hashlib.sha256(spec.key("", "").encode()).hexdigest()[:32]


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """Process ``pid``'s state letter and start time (clock ticks since boot) from ``/proc``;
    None where there is no such file (not Linux, or no such process)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2:].split()  # NOTE: the command name may hold spaces
    if len(fields) < 20:
        return None
    return fields[0].decode("ascii", "replace"), fields[19].decode("ascii", "replace")


def _start_time(pid: int) -> str | None:
    found = _proc_stat(pid)
    return found[1] if found is not None else None


def _alive(pid: int, start: str | None) -> bool:
    """Whether process ``pid`` runs (not a zombie) and, where ``start`` is known, is the one
    that started then. True where it cannot be told (its entries are then kept)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists (another user's)
    except OSError:
        return True
    found = _proc_stat(pid)
    if found is None:
        return True
    state, started = found
    return state != "Z" and (start is None or start == started)


@dataclass(frozen=True)
class _Entry:
    """One ``running/`` file: a compile of ``digest`` by process ``pid`` (see the module)."""

    path: Path
    digest: str
    pid: int
    start: str | None = None  # the writer's start time (None: not recorded)
    parent: int | None = None  # the writer's parent (None: not recorded)
    parent_start: str | None = None

    @property
    def writer_alive(self) -> bool:
        return _alive(self.pid, self.start)

    @property
    def parent_alive(self) -> bool:
        return self.parent is not None and _alive(self.parent, self.parent_start)


def _read_entry(path: Path, limit: int = _ENTRY_BYTES) -> bytes | None:
    """The first bytes of a regular file, None for anything else; never blocks (a FIFO put
    there is opened without waiting for a writer, then refused) nor follows a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def _field(fields: list[str], i: int) -> str | None:
    return fields[i] if len(fields) > i and fields[i] != "-" and fields[i].isdigit() else None


class CrashJournal:
    """The journal in ``folder`` (created if missing); opening it removes stale entries (see
    the module)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._running = self.folder / "running"
        self._running.mkdir(parents=True, exist_ok=True)
        self._crashed_file = self.folder / "crashed"
        self._lock = threading.Lock()
        self._mine: set[Path] = set()  # entries this journal wrote and has not removed
        self._closed = False  # set at interpreter exit: nothing more is journaled
        self._write_failed = False  # a write failed already (logged once)
        self._me: tuple[int, str | None] | None = None  # pid, start time (per forked process)
        self._parent: tuple[int, str | None] | None = None
        me = weakref.ref(self)

        def at_exit() -> None:
            journal = me()
            if journal is not None:
                journal._exit()

        atexit.register(at_exit)
        self._drop_stale()

    # -- writing (the compiling process) ---------------------------------------------------
    @contextlib.contextmanager
    def running(self, digest: str) -> Iterator[None]:
        """Journal ``digest`` as being compiled for the duration of the block (unjournaled,
        logged, if its entry cannot be written)."""
        path = self._write(digest)
        try:
            yield
        finally:
            if path is not None:
                with self._lock:
                    self._mine.discard(path)
                self._remove(path)

    def _write(self, digest: str) -> Path | None:
        pid = os.getpid()
        path = self._running / f"{digest}.{pid}.{threading.get_native_id()}"
        # NOTE: under the lock, so an entry is either written before the exit hook removes
        # this process's entries or not written at all.
        with self._lock:
            if self._closed:
                return None
            try:
                path.write_text(f"{digest} {self._line(pid)}\n")
            except OSError as e:
                level = logging.DEBUG if self._write_failed else logging.WARNING
                self._write_failed = True
                FAILURES.report(Failure.JOURNAL, log, level, "crash journal %s: could not "
                                "write an entry (compiles run unjournaled: a native crash in "
                                "one will not be pinned on its constraint): %s", self.folder, e)
                return None
            self._mine.add(path)
        return path

    def _line(self, pid: int) -> str:
        """``<start> <parent pid> <parent start>`` of this process (``-``: unknown)."""
        if self._me is None or self._me[0] != pid:
            self._me = (pid, _start_time(pid))
        parent = os.getppid()
        if self._parent is None or self._parent[0] != parent:
            self._parent = (parent, _start_time(parent))
        return f"{self._me[1] or '-'} {parent} {self._parent[1] or '-'}"

    def _exit(self) -> None:
        """Interpreter exit: remove this process's entries (a normal exit blames no compile,
        even one a daemon thread is still running) and journal nothing more."""
        pid = os.getpid()
        with self._lock:
            self._closed = True
            mine, self._mine = self._mine, set()
        for path in mine:
            found = _ENTRY.fullmatch(path.name)
            if found is not None and int(found.group(2)) == pid:  # NOTE: not a forked parent's
                self._remove(path)

    # -- reading (the process that saw a death) --------------------------------------------
    def collect(self, pid: int | None = None) -> list[str]:
        """The digests of the compiles the dead process ``pid`` left running, moved into the
        crashed list (call it once the process is gone; a live process's entries are never
        taken). ``pid`` None: the entries of every dead writer whose parent is this process,
        gone, or not recorded. Never raises: what it could not do is logged and counted."""
        found: list[str] = []
        try:
            me = os.getpid()
            for entry in self._entries():
                if pid is not None and entry.pid != pid:
                    continue
                if pid is None and (entry.writer_alive or (
                        entry.parent not in (None, me) and entry.parent_alive)):
                    continue
                self._remove(entry.path)
                if entry.digest not in found:
                    found.append(entry.digest)
            if found:
                self._add_crashed(found)
        except Exception as e:  # noqa: BLE001 - the caller's death path must go on
            FAILURES.report(Failure.JOURNAL, log, logging.ERROR, "crash journal %s: collect "
                            "failed", self.folder, exc_info=e)
        return found

    def crashed(self) -> frozenset[str]:
        """The digests of the specs that were compiling when a process died (empty, logged, if
        the list cannot be read)."""
        return frozenset(self._read())

    def _drop_stale(self) -> None:
        """Remove the entries whose writer and parent are both gone (see the module)."""
        try:
            stale = [e for e in self._entries() if not e.writer_alive and not e.parent_alive]
            for entry in stale:
                self._remove(entry.path)
        except Exception as e:  # noqa: BLE001 - a journal that cannot clean up still works
            FAILURES.report(Failure.JOURNAL, log, logging.WARNING, "crash journal %s: could "
                            "not remove stale entries", self.folder, exc_info=e)
            return
        if stale:
            log.info("crash journal %s: removed %d entries of processes that are gone, not "
                     "blamed (nobody saw them die): %s", self.folder, len(stale),
                     ", ".join(sorted({e.digest for e in stale})))

    def _entries(self) -> Iterator[_Entry]:
        """The journal entries in ``running/``; anything else there is left, logged."""
        try:
            names = sorted(os.listdir(self._running))
        except OSError as e:
            FAILURES.report(Failure.JOURNAL, log, logging.WARNING, "crash journal %s: could "
                            "not list its entries: %s", self.folder, e)
            return
        foreign: list[str] = []
        for name in names:
            path = self._running / name
            named = _ENTRY.fullmatch(name)
            raw = _read_entry(path) if named is not None else None
            if named is None or raw is None:
                if path.exists() or path.is_symlink():  # NOTE: not one just removed
                    foreign.append(name)
                continue
            fields = raw.decode("ascii", "replace").split()
            parent = _field(fields, 2)
            yield _Entry(path, named.group(1), int(named.group(2)), _field(fields, 1),
                         int(parent) if parent is not None else None, _field(fields, 3))
        if foreign:
            FAILURES.report(Failure.JOURNAL, log, logging.WARNING, "crash journal %s: %d "
                            "entries in running/ are not journal files (left there): %s",
                            self.folder, len(foreign), ", ".join(map(repr, foreign[:8])))

    def _remove(self, path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            FAILURES.report(Failure.JOURNAL, log, logging.WARNING, "crash journal %s: could "
                            "not remove %s: %s", self.folder, path.name, e)

    def _add_crashed(self, found: list[str]) -> None:
        """Append ``found`` to the crashed list (one collector at a time where flock exists)."""
        try:
            with self._list_lock():
                kept = [d for d in self._read() if d not in found] + found
                tmp = self.folder / f"crashed.{os.getpid()}.{threading.get_ident()}.tmp"
                tmp.write_text("".join(d + "\n" for d in kept[-MAX_CRASHED:]))
                try:
                    tmp.replace(self._crashed_file)
                finally:
                    with contextlib.suppress(OSError):
                        tmp.unlink()
        except OSError as e:
            FAILURES.report(Failure.JOURNAL, log, logging.ERROR, "crash journal %s: could not "
                            "write the crashed list (the next engine will compile %s again): "
                            "%s", self.folder, ", ".join(found), e)

    @contextlib.contextmanager
    def _list_lock(self) -> Iterator[None]:
        if fcntl is None:
            yield
            return
        fd = os.open(self.folder / "crashed.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # NOTE: closing releases the lock

    def _read(self) -> list[str]:
        try:
            raw = self._crashed_file.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as e:
            FAILURES.report(Failure.JOURNAL, log, logging.ERROR, "crash journal %s: could not "
                            "read the crashed list (no constraint is refused for it): %s",
                            self.folder, e)
            return []
        lines = raw.decode("ascii", "replace").split("\n")
        return [line for line in lines if _DIGEST.fullmatch(line)]
