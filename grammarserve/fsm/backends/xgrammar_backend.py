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

from grammarserve.constraints import ConstraintKind, GrammarSyntax
from grammarserve.errors import GrammarBackendError, GrammarError, GrammarSyntaxError
from grammarserve.fsm.backends.base import GrammarBackend
from grammarserve.fsm.backends.messages import translate
from grammarserve.fsm.backends.xgrammar_subset import slow_masks_at, xgrammar_schema
from grammarserve.fsm.config import GrammarConfig, GrammarSpec
from grammarserve.fsm.matcher import CompiledGrammar, Matcher, SharedMasks
from grammarserve.fsm.runs import MAX_DIGITS, RunBudget, RunTracker, digit_budget
from grammarserve.fsm.text_finite import unproductive_rules
from grammarserve.fsm.vocab import VocabInfo

#: xgrammar separators (item, key) of the fixed JSON styles.
#: Compiled grammars larger than this in memory are not written to the disk cache: xgrammar's
#: JSON of a grammar grows faster than the grammar (an object of 600 optional properties:
#: 2.4 MiB in memory, 118 MiB of JSON, 1.8 GiB of peak memory while writing it; of 2,000, the
#: soak's ``props_2000_optional``: 17 MiB in memory, and the engine grew ~800 MiB/s until it
#: was killed). The largest schema of ``schemas/`` takes 0.8 MiB in memory and 0.9 MiB as JSON.
MAX_SERIALIZED_BYTES = 1 << 20

_SEPARATORS = {"compact": (",", ":"), "spaced": (", ", ": ")}


class XGrammarMatcher(Matcher):
    """A matcher over ``xgrammar.GrammarMatcher``."""

    def __init__(self, vocab: VocabInfo, inner: Any, shared: SharedMasks | None = None,
                 runs: tuple[RunTracker, ...] = ()) -> None:
        super().__init__(vocab, shared, runs)
        self._m = inner

    def _accept(self, token_id: int) -> bool:
        return bool(self._m.accept_token(token_id))

    def _fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._m.fill_next_token_bitmask(bitmask, row)

    def _forced(self) -> list[int]:
        return list(self._m.find_jump_forward_tokens())

    def _rollback(self, n: int) -> None:
        self._m.rollback(n)

    def _backend_error(self) -> str | None:
        return None


class XGrammarCompiled(CompiledGrammar):
    """A grammar xgrammar compiled; ``native`` is its ``xgrammar.CompiledGrammar``."""

    def __init__(self, native: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.native = native


class XGrammarBackend(GrammarBackend):
    """Compiles specs with xgrammar."""

    name = "xgrammar"
    serial_format = str(xgr.get_serialization_version())

    def __init__(self, vocab: VocabInfo, config: GrammarConfig) -> None:
        super().__init__(vocab, config)
        info = _tokenizer_info(vocab)
        # NOTE: a foreground compile builds token masks lazily (~1.5 ms instead of 8-50 ms at
        # p50, up to ~1 s); a background one (auto's upgrade) builds them all ahead of time.
        self._compilers = {
            background: xgr.GrammarCompiler(info, max_threads=config.backend_threads,
                                            cache_enabled=False,
                                            enable_dynamic_compilation=not background)
            for background in (False, True)}
        self._info = info
        self._budgets: dict[tuple[str, int], RunBudget] = {}
        self._lock = threading.Lock()

    def warmup(self, max_whitespace: int | None) -> None:
        if self.config.json_style == "flexible" and max_whitespace:
            self._budget("whitespace", max_whitespace)
        if not self.config.open_schemas:
            self._budget("digits", MAX_DIGITS)

    def _budget(self, chars: str, limit: int) -> RunBudget:
        with self._lock:
            if (chars, limit) not in self._budgets:
                tokens, n = self._info.decoded_vocab, self.vocab.vocab_size
                self._budgets[chars, limit] = (digit_budget(tokens, n, limit)
                                               if chars == "digits"
                                               else RunBudget(tokens, n, limit))
            return self._budgets[chars, limit]

    def accepts(self, spec: GrammarSpec) -> bool:
        if len(spec.source) > self.config.limits.xgrammar_max_bytes:
            return False
        if spec.kind != ConstraintKind.JSON_SCHEMA:
            return spec.kind not in (ConstraintKind.TOOL_CALLS, ConstraintKind.STRUCTURAL_TAG)
        if spec.option("json_style") not in (*_SEPARATORS, "indented", "flexible"):
            return False
        try:
            xgrammar_schema(json.loads(spec.source))
        except GrammarError:
            return False
        return True

    def upgrade_pays(self, spec: GrammarSpec) -> bool:
        return (spec.kind != ConstraintKind.JSON_SCHEMA
                or slow_masks_at(json.loads(spec.source)) is None)

    def _json_grammar(self, spec: GrammarSpec) -> Any:
        schema = json.dumps(xgrammar_schema(json.loads(spec.source)))
        style = spec.option("json_style")
        from_schema = xgr.Grammar.from_json_schema
        if style in _SEPARATORS:  # fixed separators: keys and punctuation are forced
            return from_schema(schema, any_whitespace=False, separators=_SEPARATORS[style],
                               strict_mode=False)
        if style == "indented":  # exactly json.dumps(indent=2): indentation is forced too
            return from_schema(schema, any_whitespace=False, indent=2, separators=(",", ": "),
                               strict_mode=False)
        if style != "flexible":
            raise GrammarBackendError(f"unknown JSON style {style!r}", backend=self.name)
        # NOTE: whitespace is left unbounded here and bounded by a RunTracker instead:
        # xgrammar's max_whitespace_cnt makes masks ~4x slower.
        return from_schema(schema, any_whitespace=True, strict_mode=False)

    def _runs(self, spec: GrammarSpec) -> list[RunBudget]:
        budgets = []
        limit = spec.option("max_whitespace")
        if spec.option("json_style") == "flexible" and limit is not None:
            budgets.append(self._budget("whitespace", limit))
        if spec.option("max_digits") is not None:
            budgets.append(self._budget("digits", spec.option("max_digits")))
        return budgets

    def _grammar(self, spec: GrammarSpec) -> Any:
        if spec.kind == ConstraintKind.JSON_SCHEMA:
            return self._json_grammar(spec)
        if spec.kind == ConstraintKind.REGEX:
            return xgr.Grammar.from_regex(spec.source)
        if spec.kind == GrammarSyntax.LARK:
            return xgr.Grammar.from_lark(spec.source)
        if spec.kind == GrammarSyntax.EBNF:
            return xgr.Grammar.from_ebnf(spec.source)
        if spec.kind == ConstraintKind.CHOICE:
            alts = " | ".join(json.dumps(o) for o in json.loads(spec.source))
            return xgr.Grammar.from_ebnf(f"root ::= {alts}")
        raise GrammarBackendError(f"xgrammar backend does not compile '{spec.kind}' grammars",
                                  backend=self.name)

    def _compile(self, spec: GrammarSpec, compiler: Any) -> Any:
        limit = self.config.limits.xgrammar_max_bytes
        if len(spec.source) > limit:
            # NOTE: xgrammar's compile time and memory grow with the grammar and cannot be
            # stopped once started (see limits.py); a larger one is left to llguidance.
            raise GrammarBackendError(
                f"the {spec.kind} is too large for xgrammar ({len(spec.source)} characters; "
                f"this server's limit is {limit}); llguidance compiles it", backend=self.name)
        grammar = self._grammar(spec)
        # NOTE: xgrammar's jump-forward follows a rule that can never be completed for ever,
        # allocating as it goes: its own grammar is checked, whatever the front end
        # let through, so every state it can reach has a finite completion.
        bad = unproductive_rules(str(grammar))
        if bad:
            raise GrammarBackendError(
                f"xgrammar's grammar for this {spec.kind} has a rule that can be entered but "
                f"never completed ({bad[0]}); a recursion needs a base case",
                backend=self.name)
        return compiler.compile_grammar(grammar)

    def compile(self, spec: GrammarSpec, *, background: bool = False) -> CompiledGrammar:
        start = time.perf_counter()
        try:
            compiled = self._compile(spec, self._compilers[background])
        except (RuntimeError, ValueError, TypeError) as e:
            msg = str(e).strip()
            if spec.kind in (GrammarSyntax.EBNF, GrammarSyntax.LARK):
                raise GrammarSyntaxError(f"xgrammar could not parse the {spec.kind} grammar: "
                                         f"{msg}", path="$.grammar") from None
            ours = translate(msg, spec, self.name)
            if ours.message != msg:
                raise GrammarBackendError(ours.message, path=ours.path,
                                          backend=self.name) from None
            raise GrammarBackendError(f"xgrammar refused the {spec.kind}: {msg}",
                                      backend=self.name) from None
        return self._wrap(spec, compiled, start, background)

    def _wrap(self, spec: GrammarSpec, compiled: Any, start: float, background: bool
              ) -> CompiledGrammar:
        vocab, shared = self.vocab, SharedMasks()
        budgets = self._runs(spec) if spec.kind == ConstraintKind.JSON_SCHEMA else []

        def make() -> Matcher:
            runs = tuple(RunTracker(b) for b in budgets)
            return XGrammarMatcher(vocab, xgr.GrammarMatcher(compiled), shared, runs)

        if background:
            # NOTE: nobody waits for a background compile, so it also computes the start mask
            # that every matcher shares (see ``SharedMasks``).
            make().fill_bitmask(torch.empty((1, vocab.bitmask_width), dtype=torch.int32), 0)
        return XGrammarCompiled(compiled, backend=self.name, kind=spec.kind, make_matcher=make,
                                size_bytes=lambda: (int(compiled.memory_size_bytes) + 4096
                                                    + shared.nbytes),
                                compile_s=time.perf_counter() - start)

    def serialize(self, grammar: CompiledGrammar) -> str | None:
        """None for a grammar over :data:`MAX_SERIALIZED_BYTES` in memory (see there)."""
        if not isinstance(grammar, XGrammarCompiled) or \
                int(grammar.native.memory_size_bytes) > MAX_SERIALIZED_BYTES:
            return None
        return str(grammar.native.serialize_json())

    def restore(self, spec: GrammarSpec, text: str) -> CompiledGrammar:
        # NOTE: xgrammar checks the tokenizer's metadata and its format version itself.
        start = time.perf_counter()
        try:
            compiled = xgr.CompiledGrammar.deserialize_json(text, self._info)
        except (RuntimeError, ValueError, TypeError) as e:
            raise ValueError(f"not a serialized xgrammar grammar: {e}") from None
        return self._wrap(spec, compiled, start, background=True)


def _tokenizer_info(vocab: VocabInfo) -> Any:
    """xgrammar's view of the vocabulary, with the special tokens as empty strings: xgrammar
    then never allows one inside the output (its own detection finds none in byte-level
    vocabularies such as SmolLM2's, so ``<|im_start|>`` was allowed inside a JSON string as
    literal text the detokenizer then drops). Stop tokens stay stop tokens (by id)."""
    info = xgr.TokenizerInfo.from_huggingface(vocab.tokenizer, vocab_size=vocab.vocab_size,
                                              stop_token_ids=list(vocab.stop_token_ids))
    if not vocab.special_token_ids:
        return info
    encoded = [""] * vocab.vocab_size
    for token, idx in vocab.tokenizer.get_vocab().items():
        if idx < vocab.vocab_size:
            encoded[idx] = token
    for idx in vocab.special_token_ids:
        encoded[idx] = ""
    return xgr.TokenizerInfo(encoded, vocab_type=info.vocab_type, vocab_size=vocab.vocab_size,
                             stop_token_ids=list(vocab.stop_token_ids),
                             add_prefix_space=info.add_prefix_space)
