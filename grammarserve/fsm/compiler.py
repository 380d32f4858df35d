"""``GrammarCompiler``: the public entry point of the grammar layer."""

from __future__ import annotations

import copy
import json
import threading
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import torch
from typing_extensions import Self

from grammarserve.constraints import ConstraintKind, GrammarSyntax, PreparedSpec
from grammarserve.errors import GrammarBackendError, GrammarError
from grammarserve.fsm.backends.messages import translate
from grammarserve.fsm.cache import CacheStats, GrammarCache
from grammarserve.fsm.check_set import CheckSet
from grammarserve.fsm.checked_matcher import CheckedGrammar
from grammarserve.fsm.config import (
    DEFAULT_DISK_CACHE_BYTES,
    DEFAULT_MAX_WHITESPACE,
    BackendName,
    GrammarConfig,
    GrammarSpec,
    JsonStyle,
)
from grammarserve.fsm.crash_journal import CRASHED_MESSAGE, CrashJournal, spec_digest
from grammarserve.fsm.disk_cache import DiskCache, code_versions, load_spec, store_spec
from grammarserve.fsm.frontend import SpecBuilder
from grammarserve.fsm.limits import GrammarLimits
from grammarserve.fsm.lru import BoundedLRU
from grammarserve.fsm.matcher import CompiledGrammar
from grammarserve.fsm.policy import AUTO_ORDER, BackendPolicy
from grammarserve.fsm.pools import BackgroundPool
from grammarserve.fsm.vocab import VocabInfo

#: Validated front-end results kept for repeated inputs.
_SPEC_MEMO_SIZE = 4096


class GrammarCompiler:
    """Compiles JSON schemas, regexes, Lark/EBNF grammars, choices and tool-call formats into
    :class:`CompiledGrammar` objects for one tokenizer, with a shared cache.

    Parameters
    ----------
    tokenizer : transformers.PreTrainedTokenizerFast
        The model's tokenizer.
    backend : {"auto", "xgrammar", "llguidance"}
        ``"auto"`` picks per grammar and falls back when a backend refuses one.
    cache_bytes : int
        Byte bound of the LRU cache of compiled grammars.
    compile_timeout_s : float
        Compiles running longer raise :class:`~grammarserve.errors.GrammarTimeoutError`.
    max_whitespace : int | None
        Whitespace characters allowed in one run between JSON tokens, for the ``indented`` and
        ``flexible`` styles (``None``: unbounded).
    json_style : {"auto", "compact", "spaced", "indented", "flexible"}
        JSON separators; ``auto`` (default) follows the model (see ``GrammarConfig``).
    open_schemas : bool
        Generate anything the schema allows, unnamed keys and endless numbers included
        (default False: only what the schema names; see ``schema/close.py``).
    vocab_size : int, optional
        The model's logits width (default ``len(tokenizer)``).
    stop_token_ids : list[int], optional
        Tokens that end generation (default: the tokenizer's EOS).
    compile_threads : int
        Concurrent compiles.
    background_upgrade : bool
        With ``auto``, upgrade reused JSON-schema grammars to xgrammar in the background
        (default True; see ``GrammarConfig``).
    upgrade_niceness : int
        CPU niceness of that upgrade (default 19; see ``GrammarConfig``).
    value_checks : bool
        Check the keywords no grammar can hold when their values close, with rollback and
        retries (default True), instead of refusing them; see ``GrammarConfig``.
    check_retries : int
        Retries of a matcher's failed value checks before it fails (default 8).
    limits : GrammarLimits, optional
        Nesting, backend-step and negative-cache bounds (see ``limits.py``).
    max_depth : int, optional
        Overrides ``limits.max_depth`` (deepest nesting of a schema, regex or grammar).
    crash_journal : str, optional
        A folder journaling each backend compile while it runs (``crash_journal.py``): the
        specs that were compiling when a process died there are refused from memory.
    disk_cache_dir : str, optional
        A folder kept across restarts and shared by processes (``disk_cache.py``): the front
        end's specs of exact requests (a first request after a restart skips the front end),
        and the grammars compiled in the background (xgrammar), which a reused grammar's
        upgrade then reads from there (see ``policy.py``). None (default): off.
    disk_cache_bytes : int
        Byte bound of that folder.
    """

    def __init__(self, tokenizer: Any, *, backend: BackendName = "auto",
                 cache_bytes: int = 256 * 1024 * 1024, compile_timeout_s: float = 10.0,
                 max_whitespace: int | None = DEFAULT_MAX_WHITESPACE,
                 json_style: JsonStyle = "auto", open_schemas: bool = False,
                 vocab_size: int | None = None, stop_token_ids: list[int] | None = None,
                 compile_threads: int = 4, background_upgrade: bool = True,
                 upgrade_niceness: int = 19, value_checks: bool = True,
                 check_retries: int = 8, limits: GrammarLimits | None = None,
                 max_depth: int | None = None, crash_journal: str | None = None,
                 force_tokenization: bool = True, disk_cache_dir: str | None = None,
                 disk_cache_bytes: int = DEFAULT_DISK_CACHE_BYTES) -> None:
        limits = limits or GrammarLimits()
        if max_depth is not None:
            limits = replace(limits, max_depth=max_depth)
        self.config = GrammarConfig(backend=backend, cache_bytes=cache_bytes,
                                    compile_timeout_s=compile_timeout_s,
                                    max_whitespace=max_whitespace, json_style=json_style,
                                    open_schemas=open_schemas,
                                    compile_threads=compile_threads,
                                    background_upgrade=background_upgrade,
                                    upgrade_niceness=upgrade_niceness,
                                    value_checks=value_checks, check_retries=check_retries,
                                    force_tokenization=force_tokenization, limits=limits,
                                    disk_cache_dir=disk_cache_dir,
                                    disk_cache_bytes=disk_cache_bytes)
        self.vocab = VocabInfo.from_tokenizer(tokenizer, vocab_size=vocab_size,
                                              stop_token_ids=stop_token_ids)
        self.disk = (DiskCache(disk_cache_dir, disk_cache_bytes)
                     if disk_cache_dir is not None else None)
        self.policy = BackendPolicy(self.vocab, self.config, self.disk)
        self.front = SpecBuilder(self.config)
        self.cache = GrammarCache(max_bytes=cache_bytes, timeout_s=compile_timeout_s,
                                  threads=compile_threads, limits=limits)
        # NOTE: front-end results by exact input, refusals included: a bad input sent again
        # is refused from here without being parsed again.
        self._specs: BoundedLRU[GrammarSpec | GrammarError] = BoundedLRU(
            _SPEC_MEMO_SIZE, limits.memo_bytes)
        self._memo_refused = 0
        self._check_pool = BackgroundPool(compile_threads, "grammarserve-checks")
        self.journal = CrashJournal(crash_journal) if crash_journal is not None else None
        self._crashed = self.journal.crashed() if self.journal is not None else frozenset()
        self._warm = threading.Event()

    # -- facts the engine needs ------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """The logits width the bitmask covers."""
        return self.vocab.vocab_size

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Token ids the mask allows where the grammar may end."""
        return self.vocab.stop_token_ids

    def token_bytes(self) -> list[bytes]:
        """Each token's bytes (empty for special tokens)."""
        return self.policy.token_bytes()

    def allocate_bitmask(self, batch_size: int) -> torch.Tensor:
        """A CPU int32 bitmask ``[batch_size, ceil(vocab_size / 32)]``, all tokens allowed."""
        return torch.full((batch_size, self.vocab.bitmask_width), -1, dtype=torch.int32)

    def warmup(self) -> None:
        """Build every backend ``auto`` may use now (about 1 s: tokenizer tables, the
        whitespace-bound tables). The engine calls it at start-up; otherwise the first compile
        does, on its caller's thread, so the compile timeout bounds compiles only."""
        names = {n for kind in AUTO_ORDER for n in self.policy.order(kind)}
        for name in sorted(names):
            self.policy.backend(name).warmup(self.config.max_whitespace)
        if self.disk is not None:
            code_versions()  # NOTE: every disk key has them (~6 ms: the source digest)
        self._warm.set()

    def clear_caches(self) -> None:
        """Forget the compiled grammars and the validated front-end results, so that the next
        compile of any schema is a cold one (benchmarks; in-flight compiles are unaffected)."""
        self.cache.clear()
        self._specs.clear()

    def cache_stats(self) -> CacheStats:
        """Hits, misses, shared in-flight compiles, timeouts, bytes and compile time; ``refused``
        counts the inputs refused from memory (front end and compile alike)."""
        stats = self.cache.stats()
        return replace(stats, refused=stats.refused + self._memo_refused,
                       disk=self.disk.cache_stats() if self.disk is not None else None)

    def close(self) -> None:
        """Stop the background work (queued upgrades, disk writes, style compiles and value-check
        plans are cancelled; running ones finish on their own). The compiler still compiles,
        on the caller's thread only, and never upgrades again. Called by the engine at
        shutdown, by ``with GrammarCompiler(...)``, and at the latest at interpreter exit."""
        self.policy.close()
        self._check_pool.close()
        self.cache.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def flush_disk_writes(self) -> None:
        """Wait for the disk cache writes queued so far (after an upgrade; tests, benchmarks)."""
        self.policy.flush_writes()

    # -- compile entry points --------------------------------------------------------------
    def compile_json_schema(self, schema: dict[str, Any] | str, *,
                            strict: bool = False) -> CompiledGrammar:
        """Compile a JSON Schema (Draft 2020-12, local ``$ref`` only).

        Parameters
        ----------
        schema : dict | str
            The schema, or its JSON text.
        strict : bool
            Apply OpenAI's strict-mode rules (raises ``StrictSchemaError`` on violations).

        Raises
        ------
        GrammarError
            A subclass naming the problem and its JSON path.
        """
        return self.compile_async(ConstraintKind.JSON_SCHEMA, schema, strict=strict).result()

    def compile_regex(self, pattern: str) -> CompiledGrammar:
        """Compile a regular expression (the whole output must match it)."""
        return self.compile_async(ConstraintKind.REGEX, pattern).result()

    def compile_grammar(self, text: str, syntax: GrammarSyntax | str = GrammarSyntax.LARK
                        ) -> CompiledGrammar:
        """Compile a context-free grammar in ``syntax`` ``"lark"`` or ``"ebnf"`` (GBNF)."""
        return self.compile_async(ConstraintKind.GRAMMAR, text, syntax=syntax).result()

    def compile_choice(self, options: list[str]) -> CompiledGrammar:
        """Compile a choice: the output is exactly one of ``options``."""
        return self.compile_async(ConstraintKind.CHOICE, options).result()

    def compile_tool_calls(self, tools: list[dict[str, Any]], mode: Any = "required", *,
                           parallel: bool = True, call_format: str = "hermes"
                           ) -> CompiledGrammar:
        """Compile a tool-call format for OpenAI ``tools`` and ``tool_choice`` ``mode``
        (``"auto"``, ``"required"`` or ``{"type": "function", "function": {"name": ...}}``).
        The grammar covers the whole output. ``call_format`` ``"hermes"``: for ``"auto"``,
        plain text without a call, or free text then the calls from the first ``<tool_call>``
        on; otherwise only calls. ``"json_array"``: one JSON array of ``{"name",
        "parameters"}`` objects (no ``"auto"``). See :mod:`grammarserve.fsm.tools`."""
        return self.compile_async(ConstraintKind.TOOL_CALLS, tools, mode, parallel=parallel,
                                  call_format=call_format).result()

    def compile_structural_tag(self, tag: dict[str, Any] | str) -> CompiledGrammar:
        """Compile a structural tag (xgrammar's format, as vLLM and SGLang take it): the
        ``response_format`` object ``{"type": "structural_tag", "format": {...}}`` or the legacy
        ``{"structures": [{"begin", "schema", "end"}], "triggers": [...]}`` (or its JSON
        text). The grammar covers the whole output. See :mod:`grammarserve.fsm.structural_tag`."""
        return self.compile_async(ConstraintKind.STRUCTURAL_TAG, tag).result()

    def compile_async(self, kind: ConstraintKind | str, *args: Any, **kwargs: Any
                      ) -> Future[CompiledGrammar]:
        """Start compiling and return a future; identical in-flight requests share one future.

        ``kind`` is a :class:`~grammarserve.constraints.ConstraintKind` (or its value:
        ``"json_schema"``, ``"regex"``, ``"grammar"``, ...), with the arguments of the matching
        ``compile_*`` method. Front-end errors (bad schema, bad syntax) are delivered through
        the future too.
        """
        try:
            spec = self._memo_spec(kind, args, kwargs)
        except GrammarError as e:
            failed: Future[CompiledGrammar] = Future()
            failed.set_exception(e)
            return failed
        return self.compile_spec_async(spec)

    def spec(self, kind: ConstraintKind | str, *args: Any, **kwargs: Any) -> GrammarSpec:
        """The front end alone: the validated :class:`GrammarSpec` of ``compile_async``'s
        arguments (remembered like a compile's); raises ``GrammarError`` naming the problem."""
        return self._memo_spec(kind, args, kwargs)

    def compile_spec_async(self, spec: GrammarSpec) -> Future[CompiledGrammar]:
        """Compile a spec made by :meth:`spec` of a compiler with the same options (in this
        process or another), without the front end."""
        if not self._warm.is_set():
            self.warmup()
        key = spec.key(self.vocab.fingerprint, self.config.backend)
        if self.journal is None:
            return self.cache.get_or_compile(key, lambda: self._compile(spec))
        digest = spec_digest(spec)
        if digest in self._crashed:
            failed: Future[CompiledGrammar] = Future()
            failed.set_exception(GrammarError(CRASHED_MESSAGE, path="$"))
            return failed

        def journaled() -> CompiledGrammar:
            assert self.journal is not None
            with self.journal.running(digest):
                return self._compile(spec)

        return self.cache.get_or_compile(key, journaled)

    def compile_prepared_async(self, prepared: PreparedSpec) -> Future[CompiledGrammar]:
        """:meth:`compile_spec_async` of a ``Constraint.prepared``, which must be a
        :class:`GrammarSpec` made by :meth:`spec` (else the future holds a ``TypeError``)."""
        if isinstance(prepared, GrammarSpec):
            return self.compile_spec_async(prepared)
        failed: Future[CompiledGrammar] = Future()
        failed.set_exception(TypeError("Constraint.prepared must be a GrammarSpec made by "
                                       f"GrammarCompiler.spec, got {type(prepared).__name__}"))
        return failed

    def _compile(self, spec: GrammarSpec) -> CompiledGrammar:
        # NOTE: validators are built beside the backend compile (which drops the GIL); a closed
        # pool (None) leaves them to this thread.
        checks = self._check_pool.submit(self._check_set, spec) if spec.checks else None
        try:
            grammar = self.policy.compile(spec)
        except GrammarBackendError:
            lean = self.front.lean(spec)
            if lean is None:
                raise
            spec, grammar, checks = lean, self.policy.compile(lean), None
        self._probe(grammar, spec)
        if not spec.checks:
            return grammar
        return CheckedGrammar(grammar, checks.result() if checks is not None
                              else self._check_set(spec), self.vocab)

    def _check_set(self, spec: GrammarSpec) -> CheckSet:
        return CheckSet(spec.checks, self.policy.token_bytes(), self.config.check_retries)

    def _probe(self, grammar: CompiledGrammar, spec: GrammarSpec) -> None:
        """Refuse a grammar that fails at its start: no token allowed there (its language is
        empty, or the vocabulary cannot begin it), or a backend limit hit by the first mask or
        jump-forward. So such a constraint is a 400 before any request runs it, streamed or
        not. The first mask is kept for the grammar's matchers (``SharedMasks``)."""
        matcher = grammar.probe()
        bitmask = self.allocate_bitmask(1)
        matcher.fill_bitmask(bitmask, 0)
        if matcher.is_error() or not bool(bitmask.any()):
            why = f" ({matcher.error()})" if matcher.is_error() else ""
            raise GrammarError("the constraint cannot be completed: it allows no token at its "
                               "start: no output satisfies it, or none this model's vocabulary "
                               f"can write{why}")
        matcher.forced_tokens()
        if matcher.is_error():
            ours = translate(matcher.error() or "", spec, grammar.backend)
            raise GrammarError(f"the constraint cannot be matched: {ours.message}",
                               path=ours.path)

    # -- front ends ------------------------------------------------------------------------
    def _memo_spec(self, kind: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> GrammarSpec:
        # NOTE: validating a large schema takes ~1 ms; a repeated request skips it. The key is
        # the exact input (key order included), so a hit returns the same spec, or raises the
        # same refusal (a copy, so no caller's traceback or message edits leak into it).
        try:
            raw = json.dumps([kind, args, kwargs], separators=(",", ":"))
        except (TypeError, ValueError, RecursionError):
            return self._spec_safely(kind, args, kwargs)
        memo = self._specs.get(raw)
        if isinstance(memo, GrammarError):
            self._memo_refused += 1
            raise copy.copy(memo).with_traceback(None)
        if memo is not None:
            return memo
        # NOTE: the request's schema is the origin of its spec (stored without it)
        given = args[0] if args else None
        stored = (load_spec(self.disk, raw, self.config, given) if self.disk is not None
                  else None)
        if stored is not None:
            self._specs.put(raw, stored, len(stored.source))
            return stored
        try:
            spec: GrammarSpec | GrammarError = self._spec_safely(kind, args, kwargs)
        except GrammarError as e:
            if self.config.limits.negative_entries == 0:
                raise
            spec = copy.copy(e).with_traceback(None)
        self._specs.put(raw, spec, len(spec.source) if isinstance(spec, GrammarSpec)
                        else len(str(spec)))
        if isinstance(spec, GrammarError):
            raise copy.copy(spec).with_traceback(None)
        if self.disk is not None:
            store_spec(self.disk, raw, self.config, spec, given)
        return spec

    def _spec_safely(self, kind: str, args: tuple[Any, ...], kwargs: dict[str, Any]
                     ) -> GrammarSpec:
        # NOTE: the depth checks come first, so no recursive walker should overflow; this is
        # the net under them (e.g. a library's parser deeper than its own limit).
        try:
            return self.front.spec(kind, *args, **kwargs)
        except RecursionError:
            raise GrammarError(f"the {kind.replace('_', ' ')} is nested too deeply to be "
                               f"read (this server's limit is {self.config.limits.max_depth} "
                               "levels)", path="$") from None

    def with_backend(self, backend: BackendName) -> GrammarCompiler:
        """A compiler sharing this tokenizer but using ``backend`` (for benchmarks/tests)."""
        other = copy.copy(self)
        other.config = replace(self.config, backend=backend)
        other.policy = BackendPolicy(self.vocab, other.config, self.disk)
        other._warm = threading.Event()
        other.front = SpecBuilder(other.config)
        c = other.config
        other.cache = GrammarCache(max_bytes=c.cache_bytes, timeout_s=c.compile_timeout_s,
                                   threads=c.compile_threads, limits=c.limits)
        other._check_pool = BackgroundPool(c.compile_threads, "grammarserve-checks")  # its own
        return other
