"""The crash journal's bookkeeping (``grammarserve/fsm/crash_journal.py``): only a dead process's
entries are blamed, and only when its death is collected; a normal exit, a stale leftover or
junk in the folder blames nothing, and nothing the journal finds on disk makes ``collect``,
``running`` or ``crashed`` raise or block. (The crashes themselves, and the server refusing
what they name, are in tests/test_crash_containment.py.)"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from grammarserve.fsm.crash_journal import CrashJournal
from grammarserve.fsm.failures import FAILURES

D1, D2, D3 = "1" * 32, "2" * 32, "3" * 32


@pytest.fixture(autouse=True)
def _fresh_failure_log() -> None:
    FAILURES.reset()  # NOTE: no record held back by an earlier test's rate limit

# Compiles on daemon threads (as the grammar cache's workers run them): one stays inside its
# compile, one starts compile after compile, and the process exits normally meanwhile.
_EXIT_WHILE_COMPILING = r"""
import sys, threading
from pathlib import Path
from grammarserve.fsm.crash_journal import CrashJournal

journal = CrashJournal(sys.argv[1])
inside, never = threading.Event(), threading.Event()

def stuck():
    with journal.running(sys.argv[2]):
        inside.set()
        never.wait()

def busy():
    while True:
        with journal.running(sys.argv[3]):
            pass

threading.Thread(target=stuck, daemon=True).start()
threading.Thread(target=busy, daemon=True).start()
assert inside.wait(60)
print(len(list((Path(sys.argv[1]) / "running").iterdir())), flush=True)
"""

# Writes an entry, says so, and waits (until killed) inside the compile.
_HOLD = r"""
import sys
from grammarserve.fsm.crash_journal import CrashJournal

with CrashJournal(sys.argv[1]).running(sys.argv[2]):
    print("in", flush=True)
    sys.stdin.read()
"""


def _entries(folder: Path) -> list[str]:
    return sorted(p.name for p in (folder / "running").iterdir())


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    run = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                         capture_output=True, text=True, check=True)
    return int(run.stdout)


def _collect_in_thread(journal: CrashJournal, pid: int | None) -> list[str]:
    """``journal.collect(pid)``, which must return within 30 s (a FIFO must not block it)."""
    box: list[list[str]] = []
    worker = threading.Thread(target=lambda: box.append(journal.collect(pid)), daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "collect blocked"
    return box[0]


def test_a_process_that_exits_normally_while_compiling_leaves_no_entry(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-c", _EXIT_WHILE_COMPILING, str(tmp_path), D1, D2],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert int(run.stdout) >= 1  # it was inside a compile when it exited
    assert _entries(tmp_path) == []
    journal = CrashJournal(tmp_path)
    assert journal.collect() == [] and journal.crashed() == frozenset()


def test_collect_takes_only_the_dead_process_entries(tmp_path: Path) -> None:
    journal = CrashJournal(tmp_path)
    live = subprocess.Popen([sys.executable, "-c", _HOLD, str(tmp_path), D1],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert live.stdout is not None and live.stdout.readline() == "in\n"
        dead = _dead_pid()
        (tmp_path / "running" / f"{D2}.{dead}.1").write_text(D2)
        assert journal.collect(dead) == [D2]  # the live process's compile is not blamed
        [left] = _entries(tmp_path)
        assert left.startswith(f"{D1}.{live.pid}.")
        assert journal.collect() == []  # nor by a collect of every dead writer
        live.kill()
        live.wait(60)
        assert journal.collect(live.pid) == [D1]
        assert journal.crashed() == frozenset({D1, D2})
        assert _entries(tmp_path) == []
    finally:
        live.kill()
        live.wait(60)


def test_stale_entries_are_removed_at_open_and_not_blamed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    running = tmp_path / "running"
    running.mkdir()
    dead = _dead_pid()
    # a legacy entry (the digest only) and one whose parent is gone too: nobody collects them
    (running / f"{D1}.{dead}.1").write_text(D1)
    (running / f"{D2}.{dead}.2").write_text(f"{D2} 12345 {dead} 678\n")
    # the writer is gone but its parent (this process) lives: kept for it to collect
    (running / f"{D3}.{dead}.3").write_text(f"{D3} 12345 {os.getpid()} -\n")
    with caplog.at_level(logging.INFO, logger="grammarserve.fsm.crash_journal"):
        journal = CrashJournal(tmp_path)
    assert _entries(tmp_path) == [f"{D3}.{dead}.3"]
    stale = [r for r in caplog.records if "not blamed" in r.getMessage()]
    assert len(stale) == 1 and stale[0].levelno == logging.INFO
    assert D1 in stale[0].getMessage() and D2 in stale[0].getMessage()
    assert journal.crashed() == frozenset()
    assert journal.collect(dead) == [D3]


def test_junk_in_the_running_folder_never_raises_nor_blocks(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    journal = CrashJournal(tmp_path)
    running = tmp_path / "running"
    dead = _dead_pid()
    (running / f"{D1}.{dead}.1").write_bytes(b"\xff\xfe not text \x80")  # an entry's name
    (running / "notes.txt").write_bytes(b"\xff\xfe\x80")
    (running / f"{D2}.{dead}.2").mkdir()  # a directory named like an entry
    (running / "a-folder").mkdir()
    os.mkfifo(running / f"{D3}.{dead}.3")  # opening a FIFO for reading blocks
    os.mkfifo(running / "pipe")
    before = FAILURES.counts().journal
    with caplog.at_level(logging.WARNING, logger="grammarserve.fsm.crash_journal"):
        assert _collect_in_thread(journal, None) == [D1]
        assert _collect_in_thread(journal, dead) == []
    assert FAILURES.counts().journal > before
    assert any("not journal files" in r.getMessage() for r in caplog.records)
    left = set(_entries(tmp_path))
    assert left == {"notes.txt", f"{D2}.{dead}.2", "a-folder", f"{D3}.{dead}.3", "pipe"}
    assert journal.crashed() == frozenset({D1})
    CrashJournal(tmp_path)  # opening it again (stale clean-up) neither raises nor blocks


def test_a_crashed_list_that_cannot_be_written_or_read_does_not_raise(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    journal = CrashJournal(tmp_path)
    (tmp_path / "crashed").mkdir()  # NOTE: fails for root too, unlike a read-only file
    dead = _dead_pid()
    (tmp_path / "running" / f"{D1}.{dead}.1").write_text(D1)
    before = FAILURES.counts().journal
    with caplog.at_level(logging.ERROR, logger="grammarserve.fsm.crash_journal"):
        assert journal.collect(dead) == [D1]  # still told to the caller
        assert journal.crashed() == frozenset()
    assert FAILURES.counts().journal >= before + 2
    assert any("could not write the crashed list" in r.getMessage() for r in caplog.records)
    assert any("could not read the crashed list" in r.getMessage() for r in caplog.records)


def test_a_read_only_crashed_file_does_not_raise(tmp_path: Path) -> None:
    journal = CrashJournal(tmp_path)
    crashed = tmp_path / "crashed"
    crashed.write_text(D1 + "\n")
    crashed.chmod(0o444)
    dead = _dead_pid()
    (tmp_path / "running" / f"{D2}.{dead}.1").write_text(D2)
    try:
        assert journal.collect(dead) == [D2]
        # NOTE: the list is replaced, not written in place: its folder's mode is what counts
        assert journal.crashed() == frozenset({D1, D2})
    finally:
        crashed.chmod(0o644)


def test_an_entry_that_cannot_be_written_leaves_the_compile_unjournaled(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    journal = CrashJournal(tmp_path)
    (tmp_path / "running").rmdir()
    (tmp_path / "running").write_text("a file where the folder was")
    before = FAILURES.counts().journal
    ran = 0
    with caplog.at_level(logging.WARNING, logger="grammarserve.fsm.crash_journal"):
        for digest in (D1, D2):
            with journal.running(digest):
                ran += 1
    assert ran == 2
    assert FAILURES.counts().journal == before + 2
    warned = [r for r in caplog.records if "could not write an entry" in r.getMessage()]
    assert len(warned) == 1  # once per journal
    assert journal.collect() == []
