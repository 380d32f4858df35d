"""Durable state of the batch API: uploaded and produced files on disk under a data dir, file and
batch metadata in SQLite (WAL, synchronous=FULL: a row is on disk before the API answers).

Layout of the data dir::

    batch.sqlite3            files and batches tables
    files/<file id>          uploaded files (written to a temp name, fsynced, renamed)
    batches/<batch id>/      output.jsonl, errors.jsonl of a batch (registered as files when
                             the batch ends)

Every file and batch belongs to a tenant (``""`` when the server has no API keys, or for a key
without one); lookups take the caller's tenant, so another tenant's ids are simply not found.

A file whose ``expires_at`` has come is gone for the API (not listed, not found); its row and
bytes are removed when it is next looked up, by :meth:`BatchStore.sweep_expired` (run when the
store opens, on every list and upload, and by the batch worker while idle). The input file of a
batch still running is only hidden: its bytes stay until the batch ends. Time is the store's
``clock`` (wall-clock seconds; tests pass their own).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grammarserve.errors import ErrorKind, InvalidRequestError
from grammarserve.openai.bodies import new_id

#: Batch statuses the worker still has to act on.
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
#: Every status of the OpenAI batch object.
STATUSES = ACTIVE + ("completed", "failed", "expired", "cancelled")
_DAY = 24 * 3600
#: Seconds a file lives without an ``expires_after`` policy, by purpose (OpenAI: batch files 30
#: days; other uploads until deleted). Batch outputs keep 30 days, so finished work is reclaimed.
DEFAULT_EXPIRY_S: dict[str, int | None] = {"batch": 30 * _DAY, "batch_output": 30 * _DAY}
_TIMES = ("in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at",
          "expired_at", "cancelling_at", "cancelled_at")

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, filename TEXT NOT NULL,
    purpose TEXT NOT NULL, bytes INTEGER NOT NULL, created_at INTEGER NOT NULL,
    expires_at INTEGER, path TEXT NOT NULL, tenant TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, endpoint TEXT NOT NULL,
    input_file_id TEXT NOT NULL, completion_window TEXT NOT NULL, status TEXT NOT NULL,
    output_file_id TEXT, error_file_id TEXT, errors TEXT, created_at INTEGER NOT NULL,
    {", ".join(f"{t} INTEGER" for t in _TIMES)},
    total INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0, metadata TEXT, model TEXT,
    tenant TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS files_expiry ON files (expires_at);
"""


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "grammarserve"


@dataclass(frozen=True)
class Quota:
    """A tenant's storage quota as an upload starts: ``limit`` bytes, ``used`` of them taken by
    its files (uploads and batch outputs)."""

    limit: int
    used: int

    def check(self, size: int, *, partial: bool = False) -> None:
        """Raise the quota's 413 if ``size`` more bytes would pass it (``partial``: the upload
        is still arriving, ``size`` is what came so far)."""
        if self.used + size > self.limit:
            so_far = " so far" if partial else ""
            raise InvalidRequestError(
                f"storage quota exceeded: this tenant's files take {self.used} of its "
                f"{self.limit} bytes (max_tenant_bytes) and this upload is {size} bytes"
                f"{so_far}; delete files to make room", param="file",
                kind=ErrorKind.QUOTA_EXCEEDED)


class BatchStore:
    """Files and batches of the batch API (thread-safe: one connection behind a lock).

    ``clock``: wall-clock seconds, for the times recorded and for file expiry."""

    def __init__(self, data_dir: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.data_dir = data_dir
        self._clock = clock
        (data_dir / "files").mkdir(parents=True, exist_ok=True)
        (data_dir / "batches").mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(data_dir / "batch.sqlite3", check_same_thread=False,
                                   isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        for table in ("files", "batches"):  # a data dir written before tenants existed
            cols = {r["name"] for r in self._db.execute(f"PRAGMA table_info({table})")}
            if "tenant" not in cols:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN tenant TEXT NOT NULL "
                                 "DEFAULT ''")
        self.sweep_expired()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _one(self, sql: str, args: tuple[Any, ...]) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute(sql, args).fetchone()
        return dict(row) if row is not None else None

    def _all(self, sql: str, args: tuple[Any, ...]) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self._db.execute(sql, args).fetchall()]

    def _exec(self, sql: str, args: tuple[Any, ...]) -> int:
        with self._lock:
            return self._db.execute(sql, args).rowcount

    def now(self) -> int:
        """The store's clock, in whole seconds (the unit of every recorded time)."""
        return int(self._clock())

    # -- files -----------------------------------------------------------------------------
    def create_file(self, filename: str, purpose: str, data: bytes, *, tenant: str = "",
                    expires_after: int | None = None) -> dict[str, Any]:
        """Store an upload held in memory: on disk (fsynced) first, then its row."""
        file_id, tmp = self.new_upload()
        with open(tmp, "wb") as f:
            f.write(data)
        return self.commit_upload(file_id, tmp, filename, purpose, tenant=tenant,
                                  expires_after=expires_after)

    def new_upload(self) -> tuple[str, Path]:
        """A new file id and the temporary path its upload is written to (then
        :meth:`commit_upload`, or delete the path)."""
        file_id = new_id("file", sep="-")
        return file_id, self.data_dir / "files" / f"{file_id}.part"

    def commit_upload(self, file_id: str, tmp: Path, filename: str, purpose: str, *,
                      tenant: str = "", expires_after: int | None = None,
                      max_tenant_bytes: int | None = None) -> dict[str, Any]:
        """Make a fully written upload durable (fsync, rename) and record it, expiring
        ``expires_after`` seconds from now (None: its purpose's default). With
        ``max_tenant_bytes``, the tenant's files and this one must fit it (checked with the
        insert, so concurrent uploads cannot both pass): the quota's 413 otherwise, and the
        upload is removed."""
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        path = self.data_dir / "files" / file_id
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        try:
            return self._add_file(file_id, filename, purpose, path.stat().st_size, path, tenant,
                                  expires_after, max_tenant_bytes)
        except InvalidRequestError:
            path.unlink(missing_ok=True)
            raise

    def register_file(self, path: Path, filename: str, purpose: str, *, tenant: str = ""
                      ) -> dict[str, Any]:
        """Make a file already on disk (a batch's output) downloadable (once: registering the
        same path again returns the existing file)."""
        found = self._one("SELECT * FROM files WHERE path = ?", (str(path),))
        if found is not None:
            return found
        file_id = new_id("file", sep="-")
        return self._add_file(file_id, filename, purpose, path.stat().st_size, path, tenant,
                              None, None)

    def _add_file(self, file_id: str, filename: str, purpose: str, size: int, path: Path,
                  tenant: str, expires_after: int | None, max_tenant_bytes: int | None
                  ) -> dict[str, Any]:
        now = self.now()
        ttl = expires_after if expires_after is not None else DEFAULT_EXPIRY_S.get(purpose)
        with self._lock:  # NOTE: one critical section: the quota holds under concurrent uploads
            if max_tenant_bytes is not None:
                Quota(max_tenant_bytes, self._stored_bytes(tenant)).check(size)
            self._db.execute(
                "INSERT INTO files (id, filename, purpose, bytes, created_at, expires_at, "
                "path, tenant) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (file_id, filename, purpose, size, now, None if ttl is None else now + ttl,
                 str(path), tenant))
        found = self.get_file(file_id, tenant=tenant, include_expired=True)
        assert found is not None
        return found

    def get_file(self, file_id: str, *, tenant: str = "", include_expired: bool = False
                 ) -> dict[str, Any] | None:
        """The file, if it is ``tenant``'s and has not expired (``include_expired``: even then,
        while its bytes are kept, for the worker reading a running batch's input)."""
        row = self._one("SELECT * FROM files WHERE id = ? AND tenant = ?", (file_id, tenant))
        if row is None or include_expired or not self._expired(row):
            return row
        self.sweep_expired()
        return None

    def list_files(self, *, purpose: str | None, after: str | None, limit: int,
                   tenant: str = "") -> tuple[list[dict[str, Any]], bool]:
        """``tenant``'s unexpired files, newest first (see :meth:`_page`)."""
        self.sweep_expired()
        where = "(expires_at IS NULL OR expires_at > ?)"
        args: tuple[Any, ...] = (self.now(),)
        if purpose:
            where, args = f"{where} AND purpose = ?", (*args, purpose)
        return self._page("files", after, limit, tenant, where, args)

    def quota(self, tenant: str, limit: int) -> Quota:
        """``tenant``'s quota of ``limit`` bytes, with what its files take now (expired files
        swept first; a running batch's expired input still counts: its bytes are on disk)."""
        self.sweep_expired()
        with self._lock:
            return Quota(limit, self._stored_bytes(tenant))

    def _stored_bytes(self, tenant: str) -> int:
        """Bytes of ``tenant``'s files and of its running batches' result files so far
        (registered as files once the batch ends). Call with the lock held."""
        row = self._db.execute("SELECT COALESCE(SUM(bytes), 0) FROM files WHERE tenant = ?",
                               (tenant,)).fetchone()
        running = self._db.execute(
            f"SELECT id FROM batches WHERE tenant = ? AND status IN ({_marks(ACTIVE)})",
            (tenant, *ACTIVE)).fetchall()
        partial = sum(p.stat().st_size for (bid,) in running
                      for p in (self.data_dir / "batches" / bid).glob("*") if p.is_file())
        return int(row[0]) + partial

    def _expired(self, row: dict[str, Any]) -> bool:
        return row["expires_at"] is not None and row["expires_at"] <= self.now()

    def sweep_expired(self) -> int:
        """Remove the rows and bytes of every expired file (all tenants) but the inputs of
        batches still running; how many were removed."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, path FROM files WHERE expires_at <= ? AND id NOT IN (SELECT "
                f"input_file_id FROM batches WHERE status IN ({_marks(ACTIVE)}))",
                (self.now(), *ACTIVE)).fetchall()
            self._db.executemany("DELETE FROM files WHERE id = ?", [(r["id"],) for r in rows])
        for r in rows:
            Path(r["path"]).unlink(missing_ok=True)
        return len(rows)

    def delete_file(self, file_id: str, *, tenant: str = "") -> bool:
        row = self.get_file(file_id, tenant=tenant)
        if row is None:
            return False
        self._exec("DELETE FROM files WHERE id = ?", (file_id,))
        Path(row["path"]).unlink(missing_ok=True)
        return True

    # -- batches ---------------------------------------------------------------------------
    def create_batch(self, input_file_id: str, endpoint: str, completion_window: str,
                     metadata: dict[str, str] | None, *, tenant: str = "") -> dict[str, Any]:
        batch_id = new_id("batch", sep="_")
        now = self.now()
        self._exec("INSERT INTO batches (id, endpoint, input_file_id, completion_window, "
                   "status, created_at, expires_at, metadata, tenant) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   (batch_id, endpoint, input_file_id, completion_window, "validating", now,
                    now + _DAY, json.dumps(metadata) if metadata is not None else None, tenant))
        found = self.get_batch(batch_id, tenant=tenant)
        assert found is not None
        return found

    def get_batch(self, batch_id: str, *, tenant: str | None = "") -> dict[str, Any] | None:
        """The batch, if it is ``tenant``'s (None: any tenant's, for the worker)."""
        if tenant is None:
            return self._one("SELECT * FROM batches WHERE id = ?", (batch_id,))
        return self._one("SELECT * FROM batches WHERE id = ? AND tenant = ?",
                         (batch_id, tenant))

    def list_batches(self, *, after: str | None, limit: int, tenant: str = ""
                     ) -> tuple[list[dict[str, Any]], bool]:
        return self._page("batches", after, limit, tenant, None, ())

    def active_batches(self) -> list[dict[str, Any]]:
        """Batches the worker must still move forward, oldest first."""
        return self._all(f"SELECT * FROM batches WHERE status IN ({_marks(ACTIVE)}) ORDER BY seq",
                         ACTIVE)

    def update_batch(self, batch_id: str, **fields: Any) -> None:
        if "errors" in fields and fields["errors"] is not None:
            fields["errors"] = json.dumps(fields["errors"])
        cols = ", ".join(f"{k} = ?" for k in fields)
        self._exec(f"UPDATE batches SET {cols} WHERE id = ?", (*fields.values(), batch_id))

    def set_status(self, batch_id: str, status: str, *, only_from: tuple[str, ...] = (),
                   **fields: Any) -> bool:
        """Move a batch to ``status`` (stamping ``<status>_at``), optionally only from the
        given statuses; False if it was in none of them."""
        assert status in STATUSES
        stamp = f"{status}_at"
        if stamp in _TIMES:
            fields[stamp] = self.now()
        fields["status"] = status
        cols = ", ".join(f"{k} = ?" for k in fields)
        where = "id = ?"
        args: tuple[Any, ...] = (*fields.values(), batch_id)
        if only_from:
            where += f" AND status IN ({_marks(only_from)})"
            args += only_from
        return self._exec(f"UPDATE batches SET {cols} WHERE {where}", args) > 0

    def batch_dir(self, batch_id: str) -> Path:
        path = self.data_dir / "batches" / batch_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _page(self, table: str, after: str | None, limit: int, tenant: str, where: str | None,
              args: tuple[Any, ...]) -> tuple[list[dict[str, Any]], bool]:
        """``tenant``'s rows, newest first, starting after the object ``after``;
        (rows, has_more). An ``after`` the tenant cannot see is an unknown id (no rows), so a
        cursor tells nothing of other tenants' objects."""
        conds = ["tenant = ?"] + ([where] if where else [])
        args = (tenant, *args)
        if after is not None:
            conds.append(f"seq < (SELECT seq FROM {table} WHERE id = ? AND tenant = ?)")
            args += (after, tenant)
        sql = f"SELECT * FROM {table}"
        if conds:
            sql += " WHERE " + " AND ".join(conds)
        rows = self._all(sql + " ORDER BY seq DESC LIMIT ?", (*args, limit + 1))
        return rows[:limit], len(rows) > limit


def _marks(values: tuple[str, ...]) -> str:
    """``?, ?, ?``: one SQL parameter per value."""
    return ", ".join("?" * len(values))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- API objects ---------------------------------------------------------------------------------
def file_object(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["id"], "object": "file", "bytes": row["bytes"],
            "created_at": row["created_at"], "expires_at": row["expires_at"],
            "filename": row["filename"], "purpose": row["purpose"], "status": "processed",
            "status_details": None}


def batch_object(row: dict[str, Any]) -> dict[str, Any]:
    errors = json.loads(row["errors"]) if row["errors"] else None
    out: dict[str, Any] = {
        "id": row["id"], "object": "batch", "endpoint": row["endpoint"],
        "errors": {"object": "list", "data": errors} if errors else None,
        "input_file_id": row["input_file_id"], "completion_window": row["completion_window"],
        "status": row["status"], "output_file_id": row["output_file_id"],
        "error_file_id": row["error_file_id"], "created_at": row["created_at"]}
    out.update({t: row[t] for t in _TIMES})
    out["request_counts"] = {"total": row["total"], "completed": row["completed"],
                             "failed": row["failed"]}
    out["metadata"] = json.loads(row["metadata"]) if row["metadata"] else None
    if row["model"]:
        out["model"] = row["model"]
    return out
