"""Backend selection. ``backend="auto"`` tries backends in a per-kind order and falls back
when one refuses a grammar; a named backend is used alone.

Measured on the SmolLM2 tokenizer (``benchmarks/bench_grammar.py``, schemas/ + test suite,
2 shared CPU cores): llguidance compiles a JSON schema in ~1 ms (p99 ~3 ms) and enforces every
keyword it accepts; its masks are ~15-25 us p50, ~170-280 us p99. xgrammar's ahead-of-time mask
cache takes 8-50 ms p50 and up to ~1 s, but its masks are ~3-10 us p50, ~50-90 us p99; it is
exact only on a subset of JSON Schema (``backends/xgrammar_subset.py``), and slow where an
object names properties but allows other keys (``slow_masks_at``). So for JSON schemas
``auto`` serves the first requests from llguidance (falling back to xgrammar, lazily compiled,
when llguidance refuses) and, when the schema is in xgrammar's exact subset, has no such
object and gets reused (second matcher), compiles xgrammar ahead-of-time in the background (one at a time, lowest
priority; it releases the GIL) and upgrades the cached grammar: compile latency of llguidance,
steady-state masks of xgrammar, coverage of both.

A JSON style of ``auto`` compiles one grammar per candidate style (``style.py``). They compile
side by side, each on its own thread with its start mask (llguidance builds a grammar and
computes a mask mostly without the GIL, ``benchmarks/bench_gil.py``). A JSON schema that
llguidance compiles first gets one build of both styles at once for its first requests
(``StagedGrammar``); its per-style grammars come on reuse, on the upgrade thread: xgrammar's
straight away where the upgrade would go there anyway, else llguidance's.

With a disk cache (``disk_cache.py``), every background compile of a backend that serializes
(xgrammar) is written there, and read back instead of compiled again (another process, or after
a restart), on the upgrade thread, when the upgrade runs. The first request never reads it: an
xgrammar grammar read back (``deserialize_json``, 4-10 ms: it carries the whole token-mask
cache) costs more than a cold llguidance compile (~1-3 ms). So after a restart the first
request is a cold compile without the front end (its spec is on disk too, ``compiler.py``) and
the upgrade on reuse costs a read instead of a compile (``benchmarks/bench_grammar_restart.py``).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import threading
import time
from concurrent.futures import Future

import torch

from grammarserve.constraints import ConstraintKind, GrammarSyntax
from grammarserve.errors import GrammarError, GrammarTimeoutError
from grammarserve.fsm.backends import create_backend
from grammarserve.fsm.backends.base import GrammarBackend
from grammarserve.fsm.config import AUTO_STYLES, GrammarConfig, GrammarSpec, SpecKind
from grammarserve.fsm.disk_cache import DiskCache, code_versions
from grammarserve.fsm.failures import FAILURES, Failure
from grammarserve.fsm.matcher import CompiledGrammar
from grammarserve.fsm.pools import BackgroundPool, settled
from grammarserve.fsm.style import StagedGrammar, StyledGrammar, separator_free, then_settled
from grammarserve.fsm.vocab import VocabInfo

log = logging.getLogger(__name__)

AUTO_ORDER: dict[SpecKind, tuple[str, ...]] = {
    ConstraintKind.JSON_SCHEMA: ("llguidance", "xgrammar"),
    ConstraintKind.REGEX: ("llguidance", "xgrammar"),
    GrammarSyntax.LARK: ("llguidance", "xgrammar"),
    GrammarSyntax.EBNF: ("xgrammar", "llguidance"),
    ConstraintKind.CHOICE: ("llguidance", "xgrammar"),
    ConstraintKind.TOOL_CALLS: ("llguidance",),
    ConstraintKind.STRUCTURAL_TAG: ("llguidance",),
}


def _lower_priority(niceness: int) -> None:
    """Run background upgrades at CPU niceness ``niceness`` (Linux: per thread)."""
    if niceness <= 0:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)
    except (AttributeError, OSError):  # not Linux, or not permitted: run at normal priority
        pass


def _upgrade_failed(e: Exception, what: str) -> None:
    """Count and log a failed background compile (``what`` says which and what remains): a
    backend's refusal (``GrammarError``: a limit, a timeout) at info, anything else at warning
    with its traceback."""
    if isinstance(e, GrammarError):
        FAILURES.report(Failure.UPGRADE, log, logging.INFO, "%s: %s", what, e)
    else:
        FAILURES.report(Failure.UPGRADE, log, logging.WARNING, "%s", what, exc_info=e)


#: ``auto``: after a grammar of this kind compiles, upgrade it to this backend in the background.
UPGRADES: dict[SpecKind, str] = {ConstraintKind.JSON_SCHEMA: "xgrammar"}


class BackendPolicy:
    """Owns the backends (built lazily, once) and compiles a spec with the right one(s)."""

    def __init__(self, vocab: VocabInfo, config: GrammarConfig,
                 disk: DiskCache | None = None) -> None:
        self.vocab = vocab
        self.config = config
        self.disk = disk
        self._backends: dict[str, GrammarBackend] = {}
        self._lock = threading.Lock()
        self._build_locks: dict[str, threading.Lock] = {}
        # NOTE: one background upgrade at a time: upgrades are optional and must not compete
        # with foreground compiles for the CPU.
        self._upgrades = BackgroundPool(1, "grammarserve-upgrade", _lower_priority,
                                        (config.upgrade_niceness,))
        self._styles: BackgroundPool | None = None  # started on first use

    def _style_pool(self) -> BackgroundPool:
        # NOTE: a style compile never submits to this pool itself (its style is fixed), so
        # compile workers waiting on it cannot deadlock.
        with self._lock:
            if self._styles is None:
                self._styles = BackgroundPool(
                    self.config.compile_threads * (len(AUTO_STYLES) - 1), "grammarserve-style")
            return self._styles

    def close(self) -> None:
        """Cancel queued upgrades, disk writes and style compiles and take no more (a grammar
        compiled later is served by its first backend and never upgraded)."""
        with self._lock:
            styles = self._styles
        self._upgrades.close()
        if styles is not None:
            styles.close()

    def _schedule_upgrade(self, grammar: CompiledGrammar, spec: GrammarSpec, name: str) -> None:
        # NOTE: everything (even building the backend) happens on the upgrade thread, when the
        # grammar is reused; the first compile pays nothing for it.
        def run() -> bool:
            try:
                backend = self.backend(name)
                if not backend.accepts(spec) or not backend.upgrade_pays(spec):
                    return False
                better = self._background(backend, spec)
            except Exception as e:  # noqa: BLE001 - an upgrade is optional
                _upgrade_failed(e, f"the background {name} upgrade of a {spec.kind.value} "
                                "grammar failed; it stays on its first backend")
                return False
            grammar.upgrade(better)
            return True

        # NOTE: a closed policy abandons the upgrade (a settled False / None)
        grammar.set_upgrader(lambda: self._upgrades.submit(run) or settled(False))

    def backend(self, name: str) -> GrammarBackend:
        """The backend ``name``, built on first use."""
        backend = self._backends.get(name)
        if backend is not None:
            return backend
        # NOTE: one lock per backend, so building one (~0.5 s) never blocks users of another.
        with self._lock:
            lock = self._build_locks.setdefault(name, threading.Lock())
        with lock:
            if name not in self._backends:
                self._backends[name] = create_backend(name, self.vocab, self.config)
            return self._backends[name]

    def token_bytes(self) -> list[bytes]:
        """Each token's bytes (empty for special tokens), from the llguidance backend."""
        backend = self.backend("llguidance")
        table: list[bytes] = backend.token_bytes()  # type: ignore[attr-defined]
        return table

    def order(self, kind: SpecKind) -> tuple[str, ...]:
        """Backends to try for ``kind``, in order."""
        if self.config.backend == "auto":
            return AUTO_ORDER[kind]
        return (self.config.backend,)

    def compile(self, spec: GrammarSpec, refused: tuple[str, GrammarError] | None = None
                ) -> CompiledGrammar:
        """Compile with the first backend that accepts ``spec``; if all refuse, raise the first
        refusal with every backend's reason appended. A JSON style of ``auto`` compiles every
        candidate style the backends take (see ``style.py``). ``refused``: a backend known to
        refuse ``spec`` already (not tried again) and its refusal."""
        if spec.option("json_style") == "auto":
            return self._compile_styles(spec)
        errors: list[tuple[str, GrammarError]] = []
        if refused is not None:
            errors.append((refused[0], copy.copy(refused[1])))
        for name in self.order(spec.kind):
            if refused is not None and name == refused[0]:
                continue
            try:
                grammar = self.backend(name).compile(spec)
            except GrammarTimeoutError:  # its deadline is the request's, not this backend's
                raise
            except GrammarError as e:
                errors.append((name, e))
                continue
            if (self.config.backend == "auto" and self.config.background_upgrade
                    and spec.kind in UPGRADES and name != UPGRADES[spec.kind]):
                self._schedule_upgrade(grammar, spec, UPGRADES[spec.kind])
            return grammar
        first = errors[0][1]
        if len(errors) > 1:
            first.args = ("; ".join(str(e) for _, e in errors),)
        raise first

    def _compile_styles(self, spec: GrammarSpec) -> CompiledGrammar:
        specs = [spec.with_option("json_style", style) for style in AUTO_STYLES]
        if spec.kind == ConstraintKind.JSON_SCHEMA and separator_free(spec.source):
            return self._compile_with_start(specs[0])  # NOTE: one language in every style
        if (spec.kind == ConstraintKind.JSON_SCHEMA and self.config.background_upgrade
                and self.order(spec.kind)[0] == "llguidance"):
            try:
                return self._compile_staged(specs)
            except GrammarError as e:
                # NOTE: the styles differ from it only in whitespace: llguidance refuses
                # them too, so only the other backends are tried, style by style
                return self._styled(specs, parallel=True, refused=("llguidance", e))
        return self._styled(specs, parallel=True)

    def _compile_staged(self, specs: list[GrammarSpec]) -> CompiledGrammar:
        """One llguidance build of both styles at once (``StagedGrammar``); the per-style
        grammars are compiled on the upgrade thread when the grammar is reused."""
        either = self.backend("llguidance").compile(specs[0].with_option("json_style", "either"))
        self._start_mask(either)
        grammar = StagedGrammar(either, self.vocab)

        def styled() -> CompiledGrammar | None:
            try:
                return self._styled(specs, parallel=False, upgraded=True)
            except Exception as e:  # noqa: BLE001 - an upgrade is optional
                _upgrade_failed(e, "compiling the per-style grammars of a JSON schema "
                                "failed; it keeps its grammar of both styles")
                return None

        def take_over(better: CompiledGrammar) -> Future[bool] | bool:
            grammar.upgrade(better)
            # NOTE: the styles llguidance compiled may still go to xgrammar (reused already)
            later = better.request_upgrade()
            return later if later is not None else better.backend != either.backend

        grammar.set_upgrader(
            lambda: then_settled(self._upgrades.submit(styled) or settled(None), take_over))
        return grammar

    def _styled(self, specs: list[GrammarSpec], parallel: bool, upgraded: bool = False,
                refused: tuple[str, GrammarError] | None = None) -> CompiledGrammar:
        """A :class:`StyledGrammar` of ``specs`` (one per style), compiled side by side if
        ``parallel``, else one after the other on this thread; ``upgraded``: straight to the
        upgrade backend where it would be upgraded to anyway; ``refused``: see ``compile``."""
        start = time.perf_counter()

        def one(style_spec: GrammarSpec) -> CompiledGrammar:
            if upgraded:
                return self._upgraded_with_start(style_spec)
            return self._compile_with_start(style_spec, refused)

        others: list[Future[CompiledGrammar] | None] = [
            self._style_pool().submit(one, s) for s in specs[1:]] if parallel else []
        outcomes: list[CompiledGrammar | GrammarError] = []
        for i, style_spec in enumerate(specs):
            beside = others[i - 1] if parallel and i > 0 else None
            try:  # NOTE: a closed pool left it to this thread
                outcomes.append(one(style_spec) if beside is None else beside.result())
            except GrammarError as e:  # e.g. a backend that has no such style
                outcomes.append(e)
        styles = [g for g in outcomes if isinstance(g, CompiledGrammar)]
        if not styles:
            raise next(e for e in outcomes if isinstance(e, GrammarError))
        return StyledGrammar(specs[0].kind, styles, self.vocab, time.perf_counter() - start)

    def _compile_with_start(self, spec: GrammarSpec,
                            refused: tuple[str, GrammarError] | None = None) -> CompiledGrammar:
        """``compile(spec)`` plus the grammar's start mask (kept for its matchers, see
        ``SharedMasks``), so that it is computed on this thread too."""
        grammar = self.compile(spec, refused)
        self._start_mask(grammar)
        return grammar

    def _upgraded_with_start(self, spec: GrammarSpec) -> CompiledGrammar:
        """``_compile_with_start(spec)``, but by the backend ``auto`` would upgrade it to when
        that one takes it and pays (no first grammar to build and then replace)."""
        name = UPGRADES.get(spec.kind)
        if self.config.backend == "auto" and name is not None:
            backend = self.backend(name)
            if backend.accepts(spec) and backend.upgrade_pays(spec):
                try:
                    grammar = self._background(backend, spec)
                except GrammarError:
                    pass
                else:
                    self._start_mask(grammar)
                    return grammar
        return self._compile_with_start(spec)

    # -- the disk cache --------------------------------------------------------------------
    def _grammar_key(self, spec: GrammarSpec, backend: GrammarBackend) -> str:
        return json.dumps([spec.key(self.vocab.fingerprint, backend.name), "background",
                           backend.serial_format, code_versions()], sort_keys=True)

    def _background(self, backend: GrammarBackend, spec: GrammarSpec) -> CompiledGrammar:
        """``backend.compile(spec, background=True)``, read from the disk cache where it is
        there, else written there after (on the upgrade thread, after this upgrade)."""
        if self.disk is None or not backend.serial_format:
            return backend.compile(spec, background=True)
        key = self._grammar_key(spec, backend)
        restored = self._restored(backend, spec, key)
        if restored is not None:
            return restored
        grammar = backend.compile(spec, background=True)
        self._upgrades.submit(self._write, backend, grammar, key)  # None: closed, not written
        return grammar

    def _write(self, backend: GrammarBackend, grammar: CompiledGrammar, key: str) -> None:
        assert self.disk is not None
        try:
            text = backend.serialize(grammar)
        except Exception as e:  # noqa: BLE001 - the disk cache is optional
            FAILURES.report(Failure.DISK_WRITE, log, logging.WARNING, "a %s grammar could not "
                            "be serialized for the disk cache (it is compiled again after a "
                            "restart)", backend.name, exc_info=e)
            return
        if text is not None and not self.disk.put("grammar", key, text.encode()):
            # NOTE: the store logged why (a folder not writable: once; a full disk: debug)
            FAILURES.report(Failure.DISK_WRITE, log, logging.INFO, "a %s grammar was not "
                            "written to the disk cache (too large, or the store could not "
                            "write it)", backend.name)

    def _restored(self, backend: GrammarBackend, spec: GrammarSpec, key: str
                  ) -> CompiledGrammar | None:
        assert self.disk is not None
        blob = self.disk.get("grammar", key)
        if blob is None:
            return None
        try:
            return backend.restore(spec, blob.decode())
        except (ValueError, UnicodeDecodeError):  # NOTE: the key matched: another library
            self.disk.discard("grammar", key)
            return None

    def flush_writes(self) -> None:
        """Wait for the disk writes queued so far (tests, benchmarks)."""
        queued = self._upgrades.submit(lambda: None)
        if queued is not None:
            queued.result()

    def _start_mask(self, grammar: CompiledGrammar) -> None:
        bitmask = torch.empty((1, self.vocab.bitmask_width), dtype=torch.int32)
        grammar.probe().fill_bitmask(bitmask, 0)
