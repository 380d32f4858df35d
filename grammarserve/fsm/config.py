"""Configuration and the normalized grammar request (``GrammarSpec``) of the grammar layer."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from grammarserve.constraints import SpecKind
from grammarserve.fsm.limits import GrammarLimits
from grammarserve.fsm.value_check import ValueCheck

BackendName = Literal["auto", "xgrammar", "llguidance"]
#: How JSON separators and whitespace are written (see ``style.py``). ``auto`` follows the model:
#: the candidate styles run in lock-step until the output shows one, which is then locked.
#: ``indented`` is not a candidate: offered, SmolLM2 chose it even after spaced examples and then
#: looped in 10 to 13 of 17 corpus replies (vs 3 with compact or spaced).
JsonStyle = Literal["auto", "compact", "spaced", "indented", "flexible"]
#: The concrete styles ``auto`` chooses among, in order.
AUTO_STYLES: tuple[JsonStyle, ...] = ("compact", "spaced")

#: Default bound on whitespace characters between two JSON tokens. Large enough for
#: ``json.dumps(indent=2)`` output nested 10 levels deep (newline + 20 spaces).
DEFAULT_MAX_WHITESPACE = 24
#: Default bound of the grammar disk cache's folder.
DEFAULT_DISK_CACHE_BYTES = 1024 * 1024 * 1024


@dataclass(frozen=True)
class GrammarConfig:
    """Settings of a :class:`~grammarserve.fsm.GrammarCompiler`.

    Attributes
    ----------
    backend : {"auto", "xgrammar", "llguidance"}
        Which backend compiles and matches. ``"auto"`` picks per grammar (see ``policy.py``).
    cache_bytes : int
        Upper bound of the compiled-grammar LRU cache, in (estimated) bytes.
    compile_timeout_s : float
        A compile running longer than this raises :class:`GrammarTimeoutError` for its waiters;
        it keeps its worker thread until the backend returns, but blocks nobody else.
    max_whitespace : int | None
        Maximum whitespace characters in one run between JSON tokens, for the ``flexible``
        style and indented tool calls (``None``: unbounded).
    json_style : {"auto", "compact", "spaced", "indented", "flexible"}
        JSON separators: ``compact`` ``{"a":1,"b":[2]}``; ``spaced`` ``{"a": 1, "b": [2]}``
        (``json.dumps``' default); ``indented`` (exactly ``json.dumps(indent=2)``, compiled by
        xgrammar; for tool calls, newline-led whitespace); ``flexible`` (any whitespace up to
        ``max_whitespace``); ``auto`` lets the model pick compact or spaced where its output
        first shows one and locks it (keys and punctuation stay forced; a JSON schema's
        first requests share one grammar of both styles, which forces only key tails). A fixed
        style the model does not write pushes small models off their habits and into loops.
    open_schemas : bool
        Generate anything the schema allows. By default (False) an object schema that lists
        ``properties`` but says nothing of ``additionalProperties`` generates only the named
        properties, an array with ``prefixItems`` and no ``items`` no further items, an
        unbounded integer stays within +-(2**53 - 1), and no run of digits outside strings
        is longer than 20 (a double's 17 significant digits and leading zeros). The reply stays valid
        against the schema either way.
    compile_threads : int
        Size of the compile thread pool.
    backend_threads : int
        Threads one backend compile may use internally (xgrammar's mask-cache build).
    background_upgrade : bool
        With ``auto``, upgrade a reused JSON-schema grammar to xgrammar in the background (see
        ``policy.py``). False keeps every grammar on the backend that compiled it first, so
        which backend walks an input does not depend on timing (tests).
    upgrade_niceness : int
        CPU niceness (Linux, per thread) of the background upgrade: 19 (default) runs it only
        when nothing else wants the CPU; 0 at normal priority (tests that wait for an upgrade:
        beside busy processes a niceness-19 thread gets ~1% of a core).
    value_checks : bool
        Keywords no grammar can hold (``uniqueItems`` on open item domains, ``contains``, what
        ``not`` leaves) are checked when the value carrying them closes (``schema/checks/split.py``,
        ``checked_matcher.py``) instead of refused; the grammar is compiled without them and carries
        its checks (``CompiledGrammar.value_checks``). False refuses them (400), as before.
    check_retries : int
        A matcher whose value fails its check rolls back to where the value started, bans the
        token that began it there and continues; after this many retries the request fails.
    force_tokenization : bool
        Where a JSON schema forces text (a key name after its opening quote), llguidance
        allows only the tokenizer's own split of it (and can jump it forward), while
        xgrammar allows every token that fits. False lets llguidance allow every split too
        (its ``no_forcing``), so the model spells keys as it likes on either backend (the
        engine's default, with ``json_schema_spans`` off: on SmolLM2 the key
        ``invoice_number`` is ``in`` + ``vo`` + ``ice`` at -0.36 but ``inv`` + ``oice``, the
        tokenizer's split, at -1.32, and what follows differs).
    limits : GrammarLimits
        Nesting, backend-step and negative-cache bounds (``limits.py``).
    disk_cache_dir : str | None
        A folder of front-end results and serialized background-compiled grammars kept across
        restarts and shared by the processes of a machine (``disk_cache.py``); None: off.
    disk_cache_bytes : int
        Upper bound of that folder, in bytes (least recently used entries go first).
    """

    backend: BackendName = "auto"
    cache_bytes: int = 256 * 1024 * 1024
    compile_timeout_s: float = 10.0
    max_whitespace: int | None = DEFAULT_MAX_WHITESPACE
    json_style: JsonStyle = "auto"
    open_schemas: bool = False
    compile_threads: int = 4
    backend_threads: int = 1
    background_upgrade: bool = True
    upgrade_niceness: int = 19
    value_checks: bool = True
    check_retries: int = 8
    force_tokenization: bool = True
    limits: GrammarLimits = field(default_factory=GrammarLimits)
    disk_cache_dir: str | None = None
    disk_cache_bytes: int = DEFAULT_DISK_CACHE_BYTES

    def __post_init__(self) -> None:
        if self.backend not in ("auto", "xgrammar", "llguidance"):
            raise ValueError(f"backend must be 'auto', 'xgrammar' or 'llguidance', got "
                             f"{self.backend!r}")
        if self.cache_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0, got {self.cache_bytes}")
        if not self.compile_timeout_s > 0:
            raise ValueError(f"compile_timeout_s must be > 0, got {self.compile_timeout_s}")
        if self.max_whitespace is not None and self.max_whitespace < 0:
            raise ValueError("max_whitespace must be >= 0 (0: compact JSON) or None (unbounded), got "
                             f"{self.max_whitespace}")
        if self.json_style not in ("auto", "compact", "spaced", "indented", "flexible"):
            raise ValueError("json_style must be 'auto', 'compact', 'spaced', 'indented' or "
                             f"'flexible', got {self.json_style!r}")
        if self.compile_threads < 1:
            raise ValueError(f"compile_threads must be >= 1, got {self.compile_threads}")
        if self.disk_cache_bytes < 0:
            raise ValueError(f"disk_cache_bytes must be >= 0, got {self.disk_cache_bytes}")
        if self.check_retries < 0:
            raise ValueError(f"check_retries must be >= 0, got {self.check_retries}")


@dataclass(frozen=True)
class GrammarSpec:
    """A validated, normalized grammar request: what a backend compiles and the cache keys on.

    ``source`` is canonical text: sorted-key compact JSON for JSON-based kinds, the grammar text
    otherwise. ``options`` is a sorted tuple of ``(name, value)`` pairs. ``checks`` are what the
    grammar of ``source`` does not hold, checked at run time (``value_check.py``).
    """

    kind: SpecKind
    source: str
    options: tuple[tuple[str, Any], ...] = ()
    checks: tuple[ValueCheck, ...] = ()
    #: The JSON schema as given, for a second front-end pass if a backend refuses ``source``
    #: (``GrammarCompiler``: the ``lean`` rewrite); not part of the identity.
    origin: Any = field(default=None, compare=False, repr=False)

    def option(self, name: str, default: Any = None) -> Any:
        """The value of option ``name`` (``default`` if absent)."""
        for key, value in self.options:
            if key == name:
                return value
        return default

    def with_option(self, name: str, value: Any) -> GrammarSpec:
        """This spec with option ``name`` set to ``value``."""
        options = dict(self.options)
        options[name] = value
        return GrammarSpec(self.kind, self.source, tuple(sorted(options.items())), self.checks,
                           self.origin)

    def key(self, fingerprint: str, backend: str) -> str:
        """Cache key: canonical JSON of kind, source, options, tokenizer fingerprint, backend
        (and the checks, if any)."""
        parts: list[Any] = [self.kind, self.source, list(self.options), fingerprint, backend]
        if self.checks:
            parts.append([c.key() for c in self.checks])
        return json.dumps(parts, sort_keys=True, separators=(",", ":"))


def canonical_json(value: Any) -> str:
    """Compact JSON, keys in their given order (the cache-key form of a schema).

    NOTE: keys are not sorted: property order is meaningful (keys are generated in schema
    order), so two schemas that differ only in property order are different grammars.
    """
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
