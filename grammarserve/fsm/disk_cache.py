"""A persistent grammar cache on disk, shared by the processes of one machine.

Contract
--------
- Entries live in a :class:`~grammarserve.disk_store.DiskStore` (authenticated with the
  installation's secret, atomic, bounded, shared by the processes of one user; its docstring
  has the rules): whoever can write the folder can cause misses, never another schema's
  grammar. A key names what the entry holds
  completely: its namespace (``spec``: a front end's :class:`GrammarSpec` of one exact
  request; ``grammar``: a backend's serialized compiled grammar), the request or spec, the
  options that shape it, the tokenizer's fingerprint and the versions of everything that made
  it (:func:`code_versions`).
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
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grammarserve.constraints import ConstraintKind, GrammarSyntax
from grammarserve.disk_store import DiskStore
from grammarserve.fsm.config import GrammarConfig, GrammarSpec, SpecKind
from grammarserve.fsm.value_check import ValueCheck

log = logging.getLogger(__name__)

#: Namespaces of entries.
NAMESPACES = ("spec", "grammar")


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


class DiskCache(DiskStore):
    """The grammar cache's folder (a :class:`DiskStore` of the ``spec`` and ``grammar``
    namespaces)."""

    def __init__(self, folder: str | os.PathLike[str], max_bytes: int, *,
                 secret_file: str | os.PathLike[str] | None = None) -> None:
        super().__init__(folder, max_bytes, namespaces=NAMESPACES, label="grammar disk cache",
                         secret_file=secret_file)

    def cache_stats(self) -> DiskCacheStats:
        """The store's counters as the grammar cache reports them."""
        s = self.stats()
        return DiskCacheStats(spec_hits=s.hits["spec"], grammar_hits=s.hits["grammar"],
                              misses=s.misses, writes=s.writes, corrupt=s.corrupt,
                              evictions=s.evictions, bytes=s.bytes, max_bytes=s.max_bytes)
