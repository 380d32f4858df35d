"""xgrammar backend: Earley parser with an adaptive token-mask cache; the fastest masks.

xgrammar silently ignores many JSON Schema keywords; this backend compiles only the subset it
enforces exactly (``xgrammar_subset.py``) and refuses the rest, naming the keyword.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import torch
import xgrammar as xgr

from grammarserve.errors import GrammarBackendError, GrammarError, GrammarSyntaxError
from grammarserve.fsm.backends.base import GrammarBackend
from grammarserve.fsm.backends.xgrammar_subset import xgrammar_schema
from grammarserve.fsm.config import GrammarConfig, GrammarSpec
from grammarserve.fsm.matcher import CompiledGrammar, Matcher, SharedMasks
from grammarserve.fsm.vocab import VocabInfo
from grammarserve.fsm.whitespace import WhitespaceBudget, WhitespaceTracker


class XGrammarMatcher(Matcher):
    """A matcher over ``xgrammar.GrammarMatcher``."""

    def __init__(self, vocab: VocabInfo, inner: Any,
                 whitespace: WhitespaceTracker | None = None,
                 shared: SharedMasks | None = None) -> None:
        super().__init__(vocab, shared)
        self._m = inner
        self._ws = whitespace

    def _accept(self, token_id: int) -> bool:
        ok = bool(self._m.accept_token(token_id))
        if ok and self._ws is not None:
            self._ws.advance(token_id)
        return ok

    def _fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._m.fill_next_token_bitmask(bitmask, row)
        if self._ws is not None and self._bitmask_np is not None:
            self._ws.apply(self._bitmask_np[row])

    def _forced(self) -> list[int]:
        return list(self._m.find_jump_forward_tokens())

    def _rollback(self, n: int) -> None:
        self._m.rollback(n)
        if self._ws is not None:
            self._ws.rollback(n)

    def _backend_error(self) -> str | None:
        return None


class XGrammarBackend(GrammarBackend):
    """Compiles specs with xgrammar."""

    name = "xgrammar"

    def __init__(self, vocab: VocabInfo, config: GrammarConfig) -> None:
        super().__init__(vocab, config)
        info = xgr.TokenizerInfo.from_huggingface(vocab.tokenizer, vocab_size=vocab.vocab_size,
                                                  stop_token_ids=list(vocab.stop_token_ids))
        # NOTE: a foreground compile builds token masks lazily (~1.5 ms instead of 8-50 ms at
        # p50, up to ~1 s); a background one (auto's upgrade) builds them all ahead of time.
        self._compilers = {
            background: xgr.GrammarCompiler(info, max_threads=config.backend_threads,
                                            cache_enabled=False,
                                            enable_dynamic_compilation=not background)
            for background in (False, True)}
        self._info = info
        self._budgets: dict[int, WhitespaceBudget] = {}
        self._lock = threading.Lock()

    def warmup(self, max_whitespace: int | None) -> None:
        if max_whitespace:
            self._budget(max_whitespace)

    def _budget(self, limit: int) -> WhitespaceBudget:
        with self._lock:
            if limit not in self._budgets:
                self._budgets[limit] = WhitespaceBudget(self._info.decoded_vocab,
                                                        self.vocab.vocab_size, limit)
            return self._budgets[limit]

    def accepts(self, spec: GrammarSpec) -> bool:
        if spec.kind != "json_schema":
            return spec.kind != "tool_calls"
        try:
            xgrammar_schema(json.loads(spec.source))
        except GrammarError:
            return False
        return True

    def _compile_json(self, spec: GrammarSpec, compiler: Any) -> Any:
        schema = xgrammar_schema(json.loads(spec.source))
        if spec.option("max_whitespace") == 0:  # compact JSON: fixed separators
            return compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                separators=(",", ":"), strict_mode=False)
        # NOTE: whitespace is left unbounded here and bounded by WhitespaceTracker instead:
        # xgrammar's max_whitespace_cnt makes masks ~4x slower.
        return compiler.compile_json_schema(json.dumps(schema), any_whitespace=True,
                                            strict_mode=False)

    def _compile(self, spec: GrammarSpec, compiler: Any) -> Any:
        if spec.kind == "json_schema":
            return self._compile_json(spec, compiler)
        if spec.kind == "regex":
            return compiler.compile_regex(spec.source)
        if spec.kind == "lark":
            return compiler.compile_lark(spec.source)
        if spec.kind == "ebnf":
            return compiler.compile_grammar(spec.source)
        if spec.kind == "choice":
            alts = " | ".join(json.dumps(o) for o in json.loads(spec.source))
            return compiler.compile_grammar(f"root ::= {alts}")
        raise GrammarBackendError(f"xgrammar backend does not compile {spec.kind!r} grammars",
                                  backend=self.name)

    def compile(self, spec: GrammarSpec, *, background: bool = False) -> CompiledGrammar:
        start = time.perf_counter()
        try:
            compiled = self._compile(spec, self._compilers[background])
        except (RuntimeError, ValueError, TypeError) as e:
            msg = str(e).strip()
            if spec.kind in ("ebnf", "lark"):
                raise GrammarSyntaxError(f"xgrammar could not parse the {spec.kind} grammar: "
                                         f"{msg}", path="$.grammar") from None
            raise GrammarBackendError(f"xgrammar refused the {spec.kind}: {msg}",
                                      backend=self.name) from None
        vocab, shared = self.vocab, SharedMasks()
        limit = spec.option("max_whitespace")
        budget = self._budget(limit) if spec.kind == "json_schema" and limit else None

        def make() -> Matcher:
            tracker = WhitespaceTracker(budget) if budget is not None else None
            return XGrammarMatcher(vocab, xgr.GrammarMatcher(compiled), tracker, shared)

        if background:
            # NOTE: nobody waits for a background compile, so it also computes the start mask
            # that every matcher shares (see ``SharedMasks``).
            make().fill_bitmask(torch.empty((1, vocab.bitmask_width), dtype=torch.int32), 0)
        return CompiledGrammar(backend=self.name, kind=spec.kind, make_matcher=make,
                               size_bytes=lambda: (int(compiled.memory_size_bytes) + 4096
                                                   + shared.nbytes),
                               compile_s=time.perf_counter() - start)
