"""A persistent grammar cache on disk, shared by the processes of one machine.

Contract
--------
- Entries are files in one folder, named by a digest of their full key. A key names what the
  entry holds completely: its namespace (``spec``: a front end's :class:`GrammarSpec` of one
  exact request; ``grammar``: a backend's serialized compiled grammar), the request or spec,
  the options that shape it, the tokenizer's fingerprint and the versions of everything that
  made it (:func:`code_versions`). An entry is one JSON header line (format, namespace, the
  SHA-256 of its full key, payload length and SHA-256) and the payload.
- A read returns a payload only if its header's format, key digest, length and payload digest
  all match:
  anything else (truncated, garbled, another version, another key under a colliding name) is
  counted ``corrupt``, removed and read as a miss. Nothing here raises for the folder's
  content or for I/O errors: the cache is optional, so a failure is a miss, or a write not
  made.
- Writes go to a temporary file in the same folder, then ``os.replace``: readers in any
  process see a whole old entry, a whole new one or none. Writers of the same key race
  harmlessly (the last one stays; both wrote the same content).
- The folder is bounded by ``max_bytes``: after a write takes this process's estimate over
  it, the folder is measured again and the entries used least recently (by mtime: a hit
  touches its entry) are removed until it fits. Other processes' writes are seen then.
- Payloads are JSON text (specs: :func:`spec_to_json`; xgrammar: its own
  ``serialize_json``), never pickles: a shared folder must not run code.
- A read costs what a restarted first request must pay before its backend compile, so it does
  each thing once: the key is hashed once (the file name and the header's key digest), the
  header holds no key text, and a JSON schema's spec holds no copy of the schema as given
  (its ``origin``) when that is the request's own object, which the reader supplies.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grammarserve.constraints import ConstraintKind, GrammarSyntax
from grammarserve.fsm.config import GrammarConfig, GrammarSpec, SpecKind
from grammarserve.fsm.value_check import ValueCheck

log = logging.getLogger(__name__)

#: Version of the entry layout (the header line and what follows it).
FORMAT = 2
#: Namespaces of entries.
NAMESPACES = ("spec", "grammar")
_SUFFIX = ".gsc"
_TMP_PREFIX = ".tmp-"
#: Temporary files older than this are a dead writer's, removed when the folder is measured.
_STALE_TMP_S = 300.0


@dataclass(frozen=True)
class DiskCacheStats:
    """Counters of one process's use of the disk cache (``bytes``: the folder, last measured
    or estimated)."""

    spec_hits: int = 0
    grammar_hits: int = 0
    misses: int = 0
    writes: int = 0
    corrupt: int = 0
    evictions: int = 0
    bytes: int = 0
    max_bytes: int = 0

    @property
    def hits(self) -> int:
        """Hits of both namespaces."""
        return self.spec_hits + self.grammar_hits


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _source_digest() -> str:
    """Digest of the grammar layer's source: an editable install keeps its version number
    while its code changes, and a spec of other code must not be served."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


_VERSIONS: dict[str, str] = {}
_VERSIONS_LOCK = threading.Lock()


def code_versions() -> dict[str, str]:
    """The versions every key includes: grammarserve (and its grammar layer's source digest),
    xgrammar and llguidance (a backend's serialization format is part of its grammar keys:
    ``GrammarBackend.serial_format``)."""
    with _VERSIONS_LOCK:
        if not _VERSIONS:
            _VERSIONS.update(grammarserve=_version("grammarserve"), fsm=_source_digest(),
                             xgrammar=_version("xgrammar"), llguidance=_version("llguidance"))
        return dict(_VERSIONS)


# -- GrammarSpec as JSON ---------------------------------------------------------------------
#: Not a value: a spec whose origin is the request's own schema (``given``) stores none.
_NO_GIVEN = object()


def spec_to_json(spec: GrammarSpec, given: Any = _NO_GIVEN) -> str:
    """``spec`` (its origin included) as JSON text; an origin that is ``given`` itself (the
    request's schema, which a reader passes to :func:`spec_from_json`) is written as a mark."""
    checks = [{"location": [list(step) for step in c.location], "kind": c.kind,
               "keyword": c.keyword, "schema_path": c.schema_path, "schema": c.schema,
               "item_schema": c.item_schema} for c in spec.checks]
    origin: dict[str, Any] = ({"origin_given": True} if spec.origin is not None
                              and spec.origin is given else {"origin": spec.origin})
    return json.dumps({"kind": str(spec.kind.value), "source": spec.source,
                       "options": [list(o) for o in spec.options], "checks": checks,
                       **origin}, separators=(",", ":"), ensure_ascii=False)


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _kind(value: str) -> SpecKind:
    try:
        return ConstraintKind(value)
    except ValueError:
        return GrammarSyntax(value)


def spec_from_json(text: str, given: Any = _NO_GIVEN) -> GrammarSpec:
    """The spec :func:`spec_to_json` wrote (with the same ``given``); raises
    ``ValueError``/``KeyError``/``TypeError`` on anything else."""
    d = json.loads(text)
    if d.get("origin_given") is True:
        if given is _NO_GIVEN:
            raise ValueError("the spec's origin is the request's schema, and none was given")
        d["origin"] = given
    checks = tuple(ValueCheck(location=tuple((str(s[0]), _tuples(s[1])) for s in c["location"]),
                              kind=c["kind"], keyword=c["keyword"],
                              schema_path=c["schema_path"], schema=c["schema"],
                              item_schema=c["item_schema"]) for c in d["checks"])
    options = tuple((str(k), _tuples(v)) for k, v in d["options"])
    return GrammarSpec(_kind(d["kind"]), d["source"], options, checks, origin=d["origin"])


def spec_round_trips(spec: GrammarSpec, text: str, given: Any = _NO_GIVEN) -> bool:
    """Whether ``text`` reads back as ``spec`` exactly (origin included): only such specs are
    stored."""
    try:
        back = spec_from_json(text, given)
    except (ValueError, KeyError, TypeError):
        return False
    return back == spec and back.kind is spec.kind and back.origin == spec.origin


def spec_key(raw: str, config: GrammarConfig) -> str:
    """The key of the front end's spec of the exact request ``raw`` (JSON text, no newline)
    under ``config``: what shapes it, a newline, then ``raw`` as it is (not quoted again)."""
    c = config
    # NOTE: every option the front end reads (SpecBuilder, Preparation)
    shape = [c.backend, c.json_style, c.open_schemas, c.max_whitespace, c.value_checks,
             c.force_tokenization, c.limits.max_depth]
    return json.dumps([shape, code_versions()], sort_keys=True) + "\n" + raw


def load_spec(disk: DiskCache, raw: str, config: GrammarConfig,
              given: Any = _NO_GIVEN) -> GrammarSpec | None:
    """The stored spec of request ``raw`` (see :func:`spec_key`), or None; ``given``: the
    request's schema, its origin where :func:`store_spec` was given it too."""
    key = spec_key(raw, config)
    payload = disk.get("spec", key)
    if payload is None:
        return None
    try:
        return spec_from_json(payload.decode(), given)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        disk.discard("spec", key)
        return None


def store_spec(disk: DiskCache, raw: str, config: GrammarConfig, spec: GrammarSpec,
               given: Any = _NO_GIVEN) -> None:
    """Store request ``raw``'s spec, if it reads back exactly; ``given``: the request's schema
    (not stored where it is the spec's origin: ``raw`` holds it, and :func:`load_spec` is
    given the request's own)."""
    try:
        text = spec_to_json(spec, given)
    except (TypeError, ValueError):  # NOTE: an origin JSON cannot write
        return
    if spec_round_trips(spec, text, given):
        disk.put("spec", spec_key(raw, config), text.encode())


# -- the folder ------------------------------------------------------------------------------
class DiskCache:
    """The entries of one folder, bounded by ``max_bytes`` (see the module docstring)."""

    def __init__(self, folder: str | os.PathLike[str], max_bytes: int) -> None:
        self.folder = Path(folder).expanduser()
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._counts = {"spec_hits": 0, "grammar_hits": 0, "misses": 0, "writes": 0,
                        "corrupt": 0, "evictions": 0}
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
        self._count(f"{namespace}_hits")
        return payload

    def discard(self, namespace: str, key: str) -> None:
        """Remove ``key``'s entry, just read by :meth:`get`: its payload verified but could not
        be used (a backend refused it), so that read counts as corrupt and a miss."""
        with self._lock:
            self._counts[f"{namespace}_hits"] -= 1
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
                log.warning("grammar disk cache %s is not writable (%s); not writing to it",
                            self.folder, e)
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

    def stats(self) -> DiskCacheStats:
        """A snapshot of the counters."""
        with self._lock:
            measured = self._bytes
        if measured is None:
            self._shrink()  # NOTE: measures the folder (and keeps it in bounds)
        with self._lock:
            return DiskCacheStats(bytes=self._bytes or 0, max_bytes=self.max_bytes,
                                  **self._counts)


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
