"""Durable result files: append whole lines and fsync; on open, drop a torn last line.

# NOTE: a results file is the source of truth for what a batch has done. Each record is written
# with one ``write`` of the complete line (newline included) and the file is fsynced before the
# work is counted, so a kill at any moment leaves complete lines plus at most one torn tail, which
# :func:`recover` cuts off (that request simply runs again).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from typing_extensions import Self

from grammarserve.batch.lines import InputIndex, InputLine, LineError, index_input
from grammarserve.errors import GrammarserveError


@dataclass
class Done:
    """What the output and error files of a batch already hold."""

    custom_ids: set[str] = field(default_factory=set)  # answered (output, or a 4xx/5xx reply)
    lines: set[int] = field(default_factory=set)  # input lines reported in the error file
    completed: int = 0  # records in the output file
    failed: int = 0  # records in the error file

    def add(self, record: dict[str, Any], *, error_file: bool) -> None:
        line = record.get("line")
        if error_file:
            self.failed += 1
            if isinstance(line, int):
                self.lines.add(line)
            if record.get("response") is None:  # a bad input line, not an answered request
                return
        else:
            self.completed += 1
        cid = record.get("custom_id")
        if isinstance(cid, str):
            self.custom_ids.add(cid)


def recover(path: Path) -> list[dict[str, Any]]:
    """The records of ``path`` (missing file: none). A torn last line (no newline, or not JSON)
    is truncated away; a bad line before the last one is an error (the file is not ours)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1  # bytes up to and including the last newline
    records: list[dict[str, Any]] = []
    lines = data[:keep].split(b"\n")[:-1]
    for i, raw in enumerate(lines):
        try:
            rec = json.loads(raw)
        except ValueError as e:
            if i != len(lines) - 1:
                raise GrammarserveError(f"{path}: line {i + 1} is not a batch result ({e}); "
                                        "refusing to append to it") from None
            keep -= len(raw) + 1
            break
        if not isinstance(rec, dict):
            raise GrammarserveError(f"{path}: line {i + 1} is not a batch result (not an "
                                    "object); refusing to append to it")
        records.append(rec)
    if keep < len(data):
        with open(path, "r+b") as f:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
    return records


def scan(output: Path, errors: Path) -> Done:
    """Recover both files and tell what they already hold."""
    done = Done()
    for rec in recover(output):
        done.add(rec, error_file=False)
    for rec in recover(errors):
        done.add(rec, error_file=True)
    return done


def todo_lines(index: InputIndex, done: Done) -> list[InputLine]:
    """Valid lines not yet answered, in prompt order."""
    return [x for x in index.sorted_lines()
            if x.custom_id not in done.custom_ids and x.line not in done.lines]


@dataclass(frozen=True)
class Pending:
    """What a run of an input file still has to do: ``todo`` valid lines (prompt order) and
    ``bad`` lines to answer with their errors; the rest of ``total`` is already ``done``."""

    total: int
    todo: list[InputLine]
    bad: list[LineError]
    done: Done

    @property
    def skipped(self) -> int:
        return self.total - len(self.todo) - len(self.bad)


def pending(input_path: Path, output_path: Path, error_path: Path) -> Pending:
    """Index ``input_path`` and leave out what the output and error files already answer."""
    index = index_input(input_path)
    done = scan(output_path, error_path)
    return Pending(index.total, todo_lines(index, done),
                   [e for e in index.errors if e.line not in done.lines], done)


class ResultFile:
    """Append-only JSONL file; :meth:`write` returns once the records are on disk.

    Thread-safe (the server's batch worker writes from several tasks)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def write(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        with self._lock:
            for rec in records:
                data = (json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n"
                        ).encode("utf-8")
                view = memoryview(data)
                while view:  # one write for a regular file; loop in case it is short
                    view = view[os.write(self._fd, view):]
            os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
