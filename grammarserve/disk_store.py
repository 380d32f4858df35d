"""A bounded folder of verified entries on disk, shared by the processes of one machine.

Contract
--------
- Entries are files in one folder, named by a digest of their namespace and full key. An entry
  is one JSON header line (format, namespace, the SHA-256 of its full key, payload length and
  SHA-256) and the payload.
- A read returns a payload only if its header's format, key digest, length and payload digest
  all match: anything else (truncated, garbled, another version, another key under a colliding
  name) is counted ``corrupt``, removed and read as a miss. Nothing here raises for the
  folder's content or for I/O errors: a store is optional, so a failure is a miss, or a write
  not made.
- Writes go to a temporary file in the same folder, then ``os.replace``: readers in any
  process see a whole old entry, a whole new one or none. Writers of the same key race
  harmlessly (the last one stays; both wrote the same content).
- The folder is bounded by ``max_bytes``: after a write takes this process's estimate over
  it, the folder is measured again and the entries used least recently (by mtime: a hit
  touches its entry) are removed until it fits. Other processes' writes are seen then.
- Payloads are bytes the caller decodes (never pickles: a shared folder must not run code).

Users: the grammar cache (``fsm/disk_cache.py``) and the KV disk tier (``engine/kv_tiers``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

#: Version of the entry layout (the header line and what follows it).
FORMAT = 2
_SUFFIX = ".gsc"
_TMP_PREFIX = ".tmp-"
#: Temporary files older than this are a dead writer's, removed when the folder is measured.
_STALE_TMP_S = 300.0


@dataclass(frozen=True)
class StoreStats:
    """Counters of one process's use of a store (``bytes``: the folder, last measured or
    estimated); ``hits`` per namespace."""

    hits: dict[str, int] = field(default_factory=dict)
    misses: int = 0
    writes: int = 0
    corrupt: int = 0
    evictions: int = 0
    bytes: int = 0
    max_bytes: int = 0


class DiskStore:
    """The entries of one folder in ``namespaces``, bounded by ``max_bytes`` (see the module
    docstring); ``label`` names it in log lines."""

    def __init__(self, folder: str | os.PathLike[str], max_bytes: int, *,
                 namespaces: Iterable[str], label: str) -> None:
        self.folder = Path(folder).expanduser()
        self.max_bytes = max_bytes
        self.label = label
        self._lock = threading.Lock()
        self._hits = dict.fromkeys(namespaces, 0)
        self._counts = {"misses": 0, "writes": 0, "corrupt": 0, "evictions": 0}
        self._bytes: int | None = None  # estimate of the folder's size (None: not measured)
        self._usable = True

    def _digest(self, namespace: str, key: str) -> str:
        """The SHA-256 of ``key`` in ``namespace`` (its header's; its file name's start)."""
        return hashlib.sha256(f"{FORMAT}\x00{namespace}\x00{key}".encode()).hexdigest()

    def _path(self, namespace: str, digest: str) -> Path:
        return self.folder / f"{namespace}-{digest[:40]}{_SUFFIX}"

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def get(self, namespace: str, key: str) -> bytes | None:
        """The payload stored under ``key``, or None (a miss; a bad entry is removed)."""
        digest = self._digest(namespace, key)
        path = self._path(namespace, digest)
        try:
            with open(path, "rb") as f:
                data = f.read()
                inode = os.fstat(f.fileno()).st_ino
        except OSError:
            self._count("misses")
            return None
        payload = _verified(data, namespace, digest)
        if payload is None:
            self._count("corrupt")
            self._count("misses")
            self._remove_if(path, inode)
            return None
        try:
            os.utime(path)  # NOTE: the eviction order: least recently used first
        except OSError:
            pass
        with self._lock:
            self._hits[namespace] += 1
        return payload

    def discard(self, namespace: str, key: str) -> None:
        """Remove ``key``'s entry, just read by :meth:`get`: its payload verified but could not
        be used (a backend refused it), so that read counts as corrupt and a miss."""
        with self._lock:
            self._hits[namespace] -= 1
            self._counts["misses"] += 1
            self._counts["corrupt"] += 1
        try:
            os.unlink(self._path(namespace, self._digest(namespace, key)))
        except OSError:
            pass

    def put(self, namespace: str, key: str, payload: bytes) -> bool:
        """Store ``payload`` under ``key`` (atomically); False if it was not written."""
        digest = self._digest(namespace, key)
        header = json.dumps({"format": FORMAT, "namespace": namespace, "key_sha256": digest,
                             "bytes": len(payload),
                             "sha256": hashlib.sha256(payload).hexdigest()}).encode() + b"\n"
        size = len(header) + len(payload)
        if not self._usable or size > self.max_bytes:
            return False
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=self.folder)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(header)
                    f.write(payload)
                os.replace(tmp, self._path(namespace, digest))
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as e:
            with self._lock:
                usable, self._usable = self._usable, False
            if usable:
                log.warning("%s %s is not writable (%s); not writing to it",
                            self.label, self.folder, e)
            return False
        with self._lock:
            self._counts["writes"] += 1
            if self._bytes is not None:
                self._bytes += size
            over = self._bytes is None or self._bytes > self.max_bytes
        if over:
            self._shrink()
        return True

    def _shrink(self) -> None:
        """Measure the folder; remove the least recently used entries until it fits."""
        entries: list[tuple[float, int, Path]] = []
        now = time.time()
        try:
            listing = list(os.scandir(self.folder))
        except OSError:
            return
        for item in listing:
            try:
                st = item.stat()
            except OSError:
                continue
            if item.name.startswith(_TMP_PREFIX):
                if now - st.st_mtime > _STALE_TMP_S:
                    _unlink(Path(item.path))
            elif item.name.endswith(_SUFFIX):
                entries.append((st.st_mtime, st.st_size, Path(item.path)))
        total = sum(size for _, size, _ in entries)
        evicted = 0
        for _, size, path in sorted(entries, key=lambda e: e[0]):
            if total <= self.max_bytes:
                break
            if _unlink(path):
                evicted += 1
            total -= size
        with self._lock:
            self._bytes = total
            self._counts["evictions"] += evicted

    def _remove_if(self, path: Path, inode: int) -> None:
        # NOTE: only the file that was read: another process may have replaced it since.
        try:
            if os.stat(path).st_ino == inode:
                os.unlink(path)
        except OSError:
            pass

    def contains(self, namespace: str, key: str) -> bool:
        """Whether an entry of ``key`` is present (not verified: :meth:`get` does that)."""
        return self._path(namespace, self._digest(namespace, key)).exists()

    def stats(self) -> StoreStats:
        """A snapshot of the counters."""
        with self._lock:
            measured = self._bytes
        if measured is None:
            self._shrink()  # NOTE: measures the folder (and keeps it in bounds)
        with self._lock:
            return StoreStats(hits=dict(self._hits), bytes=self._bytes or 0,
                              max_bytes=self.max_bytes, **self._counts)


def _verified(data: bytes, namespace: str, digest: str) -> bytes | None:
    """The payload of an entry's bytes if its header matches ``namespace``, the key's
    ``digest`` and the payload's, else None."""
    cut = data.find(b"\n")
    if cut < 0:
        return None
    try:
        header = json.loads(data[:cut])
    except (ValueError, UnicodeDecodeError):
        return None
    payload = data[cut + 1:]
    if not isinstance(header, dict) or header.get("format") != FORMAT \
            or header.get("namespace") != namespace or header.get("key_sha256") != digest \
            or header.get("bytes") != len(payload) \
            or header.get("sha256") != hashlib.sha256(payload).hexdigest():
        return None
    return payload


def _unlink(path: Path) -> bool:
    try:
        os.unlink(path)
    except OSError:
        return False
    return True
