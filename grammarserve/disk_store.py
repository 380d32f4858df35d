"""A bounded folder of authenticated entries on disk, shared by the processes of one user.

Contract
--------
- Entries are files in one folder, named by a keyed digest of their namespace and full key
  (an HMAC-SHA256 under the installation's secret, ``cache_secret.py``: without the secret
  nobody can tell which keys are stored). An entry is one JSON header line (format,
  namespace, that key digest, payload length, and an HMAC-SHA256 of all of these and the
  payload) and the payload.
- A read returns a payload only if its header's format, namespace, key digest and length
  match and its HMAC verifies under this store's secret. Anything else (truncated, garbled,
  another version, another key's entry copied or swapped in, an entry written or re-signed
  without the secret) is counted ``corrupt``, removed and read as a miss. So anyone who can
  write the folder can cause misses, never a wrong payload.
- Entries are opened without following links and without blocking (``O_NOFOLLOW |
  O_NONBLOCK``); only a regular file no larger than ``max_entry_bytes`` is read, from the
  descriptor that was checked: a link, a FIFO, a folder or an oversize file is a corrupt
  miss, never read, never waited on.
- Nothing here raises for the folder's content or for I/O errors: a store is optional, so a
  failure is a miss, or a write not made. Without a usable secret (it cannot be made, or is
  not to be trusted: ``cache_secret.py``) the store reads and writes nothing.
- Writes go to a new temporary file in the same folder (``O_EXCL | O_NOFOLLOW``, mode 0600),
  then ``os.replace`` (which replaces a link or FIFO in the entry's place, never follows
  it): readers in any process see a whole old entry, a whole new one or none. Writers of the
  same key race harmlessly (the last one stays; both wrote the same content).
- The folder is bounded by ``max_bytes``: after a write takes this process's estimate over
  it, the folder is measured again and the entries used least recently (by mtime: a hit
  touches its entry) are removed until it fits. Other processes' writes are seen then.
- Payloads are bytes the caller decodes (never pickles: a shared folder must not run code).

Users: the grammar cache (``fsm/disk_cache.py``) and the KV disk tier (``engine/kv_tiers``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from grammarserve.cache_secret import load_secret

log = logging.getLogger(__name__)

#: Version of the entry layout (the header line, its digests, and what follows it); 3: keyed
#: names and an HMAC (2's bare SHA-256 could be recomputed by anyone).
FORMAT = 3
#: The longest header line read (a longer first line is not an entry's).
MAX_HEADER_BYTES = 1024
_SUFFIX = ".gsc"
_TMP_PREFIX = ".tmp-"
#: Temporary files older than this are a dead writer's, removed when the folder is measured.
_STALE_TMP_S = 300.0
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


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
    """The entries of one folder in ``namespaces``, bounded by ``max_bytes`` (one entry: by
    ``max_entry_bytes`` too, header included), authenticated with the secret in
    ``secret_file`` (default: ``cache_secret.default_secret_file()``, read once, here); see
    the module docstring. ``label`` names it in log lines."""

    def __init__(self, folder: str | os.PathLike[str], max_bytes: int, *,
                 namespaces: Iterable[str], label: str, max_entry_bytes: int | None = None,
                 secret_file: str | os.PathLike[str] | None = None) -> None:
        self.folder = Path(folder).expanduser()
        self.max_bytes = max_bytes
        self.max_entry_bytes = min(max_bytes, max_entry_bytes or max_bytes)
        self.label = label
        self._lock = threading.Lock()
        self._hits = dict.fromkeys(namespaces, 0)
        self._counts = {"misses": 0, "writes": 0, "corrupt": 0, "evictions": 0}
        self._bytes: int | None = None  # estimate of the folder's size (None: not measured)
        self._usable = True
        self._secret: bytes | None
        try:
            self._secret = load_secret(secret_file)
        except OSError as e:
            self._secret = None
            log.warning("%s %s is off: %s", label, self.folder, e)

    def _digest(self, secret: bytes, namespace: str, key: str) -> str:
        """The keyed digest of ``key`` in ``namespace`` (its header's; its file name's start)."""
        text = f"{FORMAT}\x00{namespace}\x00{key}".encode("utf-8", "surrogatepass")
        return hmac.new(secret, text, hashlib.sha256).hexdigest()

    def _path(self, namespace: str, digest: str) -> Path:
        return self.folder / f"{namespace}-{digest[:40]}{_SUFFIX}"

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def get(self, namespace: str, key: str) -> bytes | None:
        """The payload stored under ``key``, or None (a miss; a bad entry is removed)."""
        secret = self._secret
        if secret is None:
            self._count("misses")
            return None
        digest = self._digest(secret, namespace, key)
        path = self._path(namespace, digest)
        try:
            fd = os.open(path, _READ_FLAGS)
        except FileNotFoundError:
            self._count("misses")
            return None
        except OSError:  # NOTE: ELOOP: a symbolic link in the entry's place
            self._bad(path, None)
            return None
        st: os.stat_result | None = None
        payload: bytes | None = None
        try:
            st = os.fstat(fd)
            data = self._read(fd, st)
            payload = None if data is None else _verified(data, secret, namespace, digest)
            if payload is not None:
                _touch(fd)  # NOTE: the eviction order: least recently used first
        except OSError:
            payload = None
        finally:
            os.close(fd)
        if payload is None:
            self._bad(path, st)
            return None
        with self._lock:
            self._hits[namespace] += 1
        return payload

    def _read(self, fd: int, st: os.stat_result) -> bytes | None:
        """The bytes of the entry open as ``fd`` (status ``st``), or None if it is not a
        regular file or larger than an entry may be (then it is not read at all)."""
        if not stat.S_ISREG(st.st_mode) or st.st_size > self.max_entry_bytes:
            return None
        limit = st.st_size + 1  # NOTE: one byte more: a file grown since fstat is seen
        chunks: list[bytes] = []
        got = 0
        while got < limit:
            chunk = os.read(fd, limit - got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks) if got <= self.max_entry_bytes else None

    def _bad(self, path: Path, st: os.stat_result | None) -> None:
        """Count a corrupt miss; remove ``path`` if it is still the file of status ``st``
        (another process may have replaced it since), or a link where ``st`` is None."""
        self._count("corrupt")
        self._count("misses")
        try:
            now = os.lstat(path)
            if (stat.S_ISLNK(now.st_mode) if st is None
                    else (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)):
                os.unlink(path)
        except OSError:
            pass

    def discard(self, namespace: str, key: str) -> None:
        """Remove ``key``'s entry, just read by :meth:`get`: its payload verified but could not
        be used (a backend refused it), so that read counts as corrupt and a miss."""
        with self._lock:
            self._hits[namespace] -= 1
            self._counts["misses"] += 1
            self._counts["corrupt"] += 1
        if self._secret is not None:
            _unlink(self._path(namespace, self._digest(self._secret, namespace, key)))

    def put(self, namespace: str, key: str, payload: bytes) -> bool:
        """Store ``payload`` under ``key`` (atomically); False if it was not written."""
        secret = self._secret
        if secret is None or not self._usable:
            return False
        digest = self._digest(secret, namespace, key)
        header = json.dumps({"format": FORMAT, "namespace": namespace, "key": digest,
                             "bytes": len(payload),
                             "hmac": entry_mac(secret, namespace, digest, payload)}
                            ).encode() + b"\n"
        size = len(header) + len(payload)
        if size > self.max_entry_bytes:
            return False
        tmp = self.folder / f"{_TMP_PREFIX}{secrets.token_hex(8)}"
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(tmp, _WRITE_FLAGS, 0o600)
        except OSError as e:
            with self._lock:
                usable, self._usable = self._usable, False
            if usable:
                log.warning("%s %s is not writable (%s); not writing to it",
                            self.label, self.folder, e)
            return False
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(header)
                f.write(payload)
            os.replace(tmp, self._path(namespace, digest))
        except BaseException as e:
            _unlink(tmp)
            if not isinstance(e, OSError):
                raise
            # NOTE: this entry only (a full disk, a folder in its place): the store stays on
            log.debug("%s: an entry was not written (%s)", self.label, e)
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
                st = item.stat(follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue  # NOTE: not an entry (read as a miss, removed by that read)
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

    def contains(self, namespace: str, key: str) -> bool:
        """Whether an entry of ``key`` is present (a regular file; not verified: :meth:`get`
        does that)."""
        if self._secret is None:
            return False
        try:
            st = os.lstat(self._path(namespace, self._digest(self._secret, namespace, key)))
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode)

    def stats(self) -> StoreStats:
        """A snapshot of the counters."""
        with self._lock:
            measured = self._bytes
        if measured is None:
            self._shrink()  # NOTE: measures the folder (and keeps it in bounds)
        with self._lock:
            return StoreStats(hits=dict(self._hits), bytes=self._bytes or 0,
                              max_bytes=self.max_bytes, **self._counts)


def entry_mac(secret: bytes, namespace: str, digest: str, payload: bytes) -> str:
    """The HMAC-SHA256 (hex) an entry's header holds: over the format, ``namespace``, the key's
    ``digest`` (keyed itself), the payload's length and the payload."""
    mac = hmac.new(secret, f"{FORMAT}\x00{namespace}\x00{digest}\x00{len(payload)}\n".encode(),
                   hashlib.sha256)
    mac.update(payload)
    return mac.hexdigest()


def _verified(data: bytes, secret: bytes, namespace: str, digest: str) -> bytes | None:
    """The payload of an entry's bytes if its header matches ``namespace``, the key's
    ``digest`` and the payload's length, and its HMAC verifies under ``secret``; else None."""
    cut = data.find(b"\n", 0, MAX_HEADER_BYTES)
    if cut < 0:
        return None
    try:
        header = json.loads(data[:cut])
    except (ValueError, RecursionError):  # NOTE: UnicodeDecodeError is a ValueError
        return None
    payload = data[cut + 1:]
    if not isinstance(header, dict) or header.get("format") != FORMAT \
            or header.get("namespace") != namespace or header.get("key") != digest \
            or header.get("bytes") != len(payload) or not isinstance(header.get("hmac"), str) \
            or not header["hmac"].isascii():  # NOTE: compare_digest takes ASCII text only
        return None
    if not hmac.compare_digest(header["hmac"], entry_mac(secret, namespace, digest, payload)):
        return None
    return payload


def _touch(fd: int) -> None:
    try:
        os.utime(fd)
    except OSError:
        pass


def _unlink(path: Path) -> bool:
    try:
        os.unlink(path)
    except OSError:
        return False
    return True
