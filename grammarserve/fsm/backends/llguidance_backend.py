"""llguidance backend: lazy Earley + derivative lexer; compile is ~1 ms, unknown JSON Schema
keywords are errors (never silently ignored)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import llguidance
import numpy as np
import torch
from llguidance.gbnf_to_lark import any_to_lark

from grammarserve.constraints import ConstraintKind, GrammarSyntax
from grammarserve.errors import GrammarBackendError, GrammarError, UnsupportedSchemaError
from grammarserve.fsm.backends.base import GrammarBackend
from grammarserve.fsm.backends.ll_probe import LLProbe
from grammarserve.fsm.backends.ll_tokenizer import from_hf_tokenizer, hf_tokenizer_json
from grammarserve.fsm.backends.messages import translate
from grammarserve.fsm.config import GrammarConfig, GrammarSpec
from grammarserve.fsm.deadlines import current
from grammarserve.fsm.freetext import FreeTextMasks, TextState
from grammarserve.fsm.matcher import CompiledGrammar, Matcher, SharedMasks
from grammarserve.fsm.runs import MAX_DIGITS, LexTracker, RunBudget, RunTracker, digit_budget
from grammarserve.fsm.schema.exact_numbers import unit_exclusive_range_text
from grammarserve.fsm.structural_lark import structural_tag_grammar
from grammarserve.fsm.style_track import StyleTable, StyleTracker
from grammarserve.fsm.tool_formats import tool_format
from grammarserve.fsm.tools import tool_calls_lark
from grammarserve.fsm.vocab import VocabInfo

_WS = r"[\x20\x0A\x0D\x09]"
#: llguidance separators (item, key) of the fixed JSON styles.
_SEPARATORS = {"compact": (",", ":"), "spaced": (", ", ": ")}
# NOTE: llguidance's estimate is not exposed; a compiled grammar is roughly its text plus
# lexer/parser tables, which we bound with a generous constant.
_BASE_BYTES = 256 * 1024


class LLGuidanceMatcher(Matcher):
    """A matcher over ``llguidance.LLMatcher``; with ``free`` (tool calls, ``auto``), the masks
    of the free text before the trigger come from that shared table."""

    def __init__(self, vocab: VocabInfo, inner: Any, shared: SharedMasks | None = None,
                 free: FreeTextMasks | None = None, runs: tuple[LexTracker, ...] = ()) -> None:
        super().__init__(vocab, shared, runs)
        self._m = inner
        self._nbytes = vocab.bitmask_width * 4
        self._stop_unrecorded = False
        self._free = free
        self._text: TextState | None = (0, b"") if free is not None else None
        self._text_history: list[TextState | None] = []
        self.spec: GrammarSpec | None = None  # what it was compiled from (for messages)

    def _accept(self, token_id: int) -> bool:
        # NOTE: llguidance does not record a stop token consumed once the grammar is complete
        # ("stopped"), so rolling it back must not undo a real token.
        self._stop_unrecorded = token_id in self._stops and bool(self._m.is_stopped())
        ok = bool(self._m.consume_token(token_id))
        if ok and self._free is not None:
            self._text_history.append(self._text)
            self._text = self._free.advance(self._text, token_id)
        return ok

    def _fill(self, bitmask: torch.Tensor, row: int) -> None:
        free, text = self._free, self._text
        if free is not None and text is not None and self._bitmask_np is not None:
            cached = free.masks.get(text)
            if cached is not None:
                np.copyto(self._bitmask_np[row], cached)
                return
            self._m.unsafe_compute_mask_ptr(bitmask.data_ptr() + row * self._nbytes,
                                            self._nbytes)
            if not self._m.is_error():
                free.put(text, self._bitmask_np[row])
            return
        self._m.unsafe_compute_mask_ptr(bitmask.data_ptr() + row * self._nbytes, self._nbytes)

    def _forced(self) -> list[int]:
        return list(self._m.compute_ff_tokens())

    def _rollback(self, n: int) -> None:
        if self._free is not None and n:
            k = min(n, len(self._text_history))
            self._text = self._text_history[-k]
            del self._text_history[-k:]
        if self._stop_unrecorded:
            self._stop_unrecorded = False
            n -= 1
        if n and not self._m.rollback(n):
            raise RuntimeError(self._m.get_error() or "llguidance refused the rollback")

    def _backend_error(self) -> str | None:
        if not self._m.is_error():
            return None
        return translate(str(self._m.get_error()), self.spec, "llguidance").message


class LLGuidanceBackend(GrammarBackend):
    """Compiles specs with llguidance."""

    name = "llguidance"

    def __init__(self, vocab: VocabInfo, config: GrammarConfig) -> None:
        super().__init__(vocab, config)
        # NOTE: not llguidance.hf.from_tokenizer: plain added tokens (Qwen's <tool_call>) must
        # keep their text for grammars that write them (see ll_tokenizer).
        self._tok = from_hf_tokenizer(vocab.tokenizer, vocab.vocab_size,
                                      list(vocab.stop_token_ids))
        self._lock = threading.Lock()
        self._token_bytes: list[bytes] | None = None
        self._digits: dict[int, RunBudget] = {}
        self._styles: StyleTable | None = None
        lim = config.limits
        # NOTE: explicit, so a grammar over them fails (its matcher's error state, a 400)
        # instead of depending on the library's defaults.
        parser_limits: dict[str, Any] = {
            "max_items_in_row": lim.max_items_in_row, "initial_lexer_fuel": lim.initial_lexer_fuel,
            "step_lexer_fuel": lim.step_lexer_fuel, "step_max_items": lim.step_max_items,
            "max_lexer_states": lim.max_lexer_states, "max_grammar_size": lim.max_grammar_size}
        self._limits = llguidance.LLParserLimits(**parser_limits)
        # NOTE: started on the first grammar over probe_bytes (see ll_probe.py)
        self.probe = LLProbe(lambda: {"tokenizer": hf_tokenizer_json(vocab.tokenizer),
                                      "n_vocab": vocab.vocab_size,
                                      "eos": list(vocab.stop_token_ids),
                                      "limits": parser_limits}, lim.probe_memory_bytes)

    def warmup(self, max_whitespace: int | None) -> None:
        self.token_bytes()
        if not self.config.open_schemas:
            self.digit_budget(MAX_DIGITS)
        if self.config.json_style == "auto":
            self.style_table()

    def style_table(self) -> StyleTable:
        """The JSON style tracker's tables (``style_track.py``; built once, ~0.1 s)."""
        tokens = self.token_bytes()
        with self._lock:
            if self._styles is None:
                self._styles = StyleTable(tokens, self.vocab.vocab_size)
            return self._styles

    def digit_budget(self, limit: int) -> RunBudget:
        """The digit-run bound's tables (built once per limit, ~0.3 s)."""
        tokens = self.token_bytes()
        with self._lock:
            if limit not in self._digits:
                self._digits[limit] = digit_budget(tokens, self.vocab.vocab_size, limit)
            return self._digits[limit]

    def token_bytes(self) -> list[bytes]:
        """Each token's bytes (empty for special tokens); built once (~30 ms)."""
        with self._lock:
            if self._token_bytes is None:
                tok = self._tok
                self._token_bytes = [b"" if tok.is_special_token(t) else tok.decode_bytes([t])
                                     for t in range(self.vocab.vocab_size)]
            return self._token_bytes

    def json_options(self, style: str, max_ws: int | None) -> dict[str, Any]:
        """llguidance JSON options of a concrete JSON ``style`` (see ``GrammarConfig``):
        fixed separators (``compact``, ``spaced``), newline-led whitespace of at most
        ``max_ws`` characters with ``": "`` (``indented``: tool calls only; an indented JSON
        schema is compiled by xgrammar, exactly), any whitespace up to ``max_ws``
        (``flexible``), or one optional space between lexemes (``either``: compact or spaced,
        internal to ``auto``, with a ``StyleTracker``)."""
        base = {"lenient": False, "coerce_one_of": False}
        if style == "either":  # compact or spaced: a StyleTracker narrows it to one of them
            return {**base, "whitespace_flexible": True, "whitespace_pattern": r"\x20",
                    "item_separator": ",", "key_separator": ":"}
        if style in _SEPARATORS:
            item, key = _SEPARATORS[style]
            return {**base, "whitespace_flexible": False, "item_separator": item,
                    "key_separator": key}
        count = "*" if max_ws is None else f"{{0,{max_ws}}}"
        if style == "indented":
            return {**base, "whitespace_flexible": True, "whitespace_pattern": rf"\n[ \t]{count}",
                    "item_separator": ",", "key_separator": ": "}
        if style != "flexible":
            raise GrammarBackendError(f"unknown JSON style {style!r}", backend=self.name)
        return {**base, "whitespace_flexible": True, "whitespace_pattern": f"{_WS}{count}",
                "item_separator": ",", "key_separator": ":"}

    def grammar_text(self, spec: GrammarSpec) -> str:
        """The llguidance grammar (JSON or Lark text) for ``spec``."""
        max_ws = spec.option("max_whitespace")
        style = spec.option("json_style", "flexible")
        if spec.kind == ConstraintKind.JSON_SCHEMA:
            if style == "indented":
                # NOTE: llguidance has no indentation rule; newline-led free whitespace let
                # SmolLM2 drift (`{\n"a": ["x",\n    "y"`) and loop in 10 of 17 corpus replies.
                raise GrammarBackendError("llguidance cannot write JSON indented exactly; "
                                          "xgrammar compiles the indented style",
                                          backend=self.name)
            options = self.json_options(style, max_ws)
            schema = None if spec.option("force_tokenization", True) else json.loads(spec.source)
            if isinstance(schema, dict):
                # NOTE: ``no_forcing`` exists only as a Lark grammar option; our options
                # replace the whole ``x-guidance`` key, so a user's cannot switch on
                # ``lenient`` (silently ignored keywords)
                text = json.dumps({**schema, "x-guidance": options}, ensure_ascii=False)
                return str(llguidance.LLMatcher.grammar_from_lark(
                    '%llguidance {"no_forcing": true}\nstart: %json ' + text))
            # NOTE: options go in ``overrides`` so an ``x-guidance`` key in the user's schema
            # cannot switch on ``lenient`` (silently ignored keywords).
            return str(llguidance.LLMatcher.grammar_from_json_schema(
                spec.source, overrides=options))  # type: ignore[arg-type]
        if spec.kind == ConstraintKind.REGEX:
            return str(llguidance.LLMatcher.grammar_from_regex(spec.source))
        if spec.kind == GrammarSyntax.LARK:
            return str(llguidance.LLMatcher.grammar_from_lark(spec.source))
        if spec.kind == GrammarSyntax.EBNF:
            return str(llguidance.LLMatcher.grammar_from_lark(any_to_lark(spec.source)))
        if spec.kind == ConstraintKind.CHOICE:
            options = json.loads(spec.source)
            alts = " | ".join(json.dumps(o) for o in options)
            return str(llguidance.LLMatcher.grammar_from_lark(f"start: {alts}\n"))
        if spec.kind == ConstraintKind.TOOL_CALLS:
            if style == "either":  # NOTE: the tracker would read free text as JSON
                raise GrammarBackendError("tool calls take a fixed JSON style",
                                          backend=self.name)
            # NOTE: between calls, the fixed styles allow at most one newline (``max_ws`` 0).
            between = 0 if style in _SEPARATORS else max_ws
            lark = tool_calls_lark(json.loads(spec.source), self.json_options(style, max_ws),
                                   between)
            return str(llguidance.LLMatcher.grammar_from_lark(lark))
        if spec.kind == ConstraintKind.STRUCTURAL_TAG:
            if style == "either":  # NOTE: the tracker would read free text as JSON
                raise GrammarBackendError("structural tags take a fixed JSON style",
                                          backend=self.name)
            return structural_tag_grammar(
                json.loads(spec.source), self.json_options(style, max_ws),
                no_forcing=not spec.option("force_tokenization", True))
        raise GrammarBackendError(f"llguidance cannot compile a '{spec.kind}' grammar",
                                  backend=self.name)

    def compile(self, spec: GrammarSpec, *, background: bool = False) -> CompiledGrammar:
        start = time.perf_counter()
        if spec.kind in (ConstraintKind.JSON_SCHEMA, ConstraintKind.TOOL_CALLS,
                         ConstraintKind.STRUCTURAL_TAG):
            trap = unit_exclusive_range_text(spec.source)
            if trap is not None:  # NOTE: auto falls back to xgrammar, which is exact there
                raise UnsupportedSchemaError(
                    f"llguidance cannot enforce the number range at {trap} exactly (an exclusive "
                    "bound at an integer with the other bound within one unit: it would take "
                    "the integer itself)", path=trap, keyword=trap.rsplit(".", 1)[-1])
        try:
            grammar = self.grammar_text(spec)
        except ValueError as e:
            raise _refusal(spec, str(e)) from None
        most = self.config.limits.max_backend_grammar_bytes
        if len(grammar) > most:  # NOTE: its parse, before any llguidance limit, grows with it
            raise GrammarBackendError(
                f"the {spec.kind} makes an llguidance grammar of {len(grammar):,} bytes, more than "
                f"this server's limit of {most:,} (max_backend_grammar_bytes); use fewer or smaller "
                "schemas", backend=self.name)
        if len(grammar) > self.config.limits.probe_bytes:
            problem = self.probe.check(grammar, current(self.config.compile_timeout_s))
            if problem is not None:
                raise _refusal(spec, problem)
        proto = llguidance.LLMatcher(self._tok, grammar, log_level=0, limits=self._limits)
        if proto.is_error():
            raise _refusal(spec, proto.get_error())
        vocab, shared = self.vocab, SharedMasks()
        free = None
        tools = json.loads(spec.source) if spec.kind == ConstraintKind.TOOL_CALLS else None
        auto_tools = tools is not None and tools["mode"] == "auto"
        form = tool_format(tools.get("format", "hermes")) if tools is not None else None
        if auto_tools and form is not None and form.trigger_anywhere:
            free = FreeTextMasks(form.triggers[0].encode(), self.token_bytes())
        # NOTE: the digit bound reads the output as JSON lexemes; the free text before an
        # ``auto`` tool call is prose, so it gets none.
        digits = spec.option("max_digits")
        budget = (self.digit_budget(digits) if digits is not None and not auto_tools
                  and spec.kind in (ConstraintKind.JSON_SCHEMA, ConstraintKind.TOOL_CALLS)
                  else None)

        styles = self.style_table() if spec.option("json_style") == "either" else None

        def make() -> Matcher:
            with self._lock:  # deep_copy of a shared prototype
                inner = proto.deep_copy()
            runs: tuple[LexTracker, ...] = (
                (RunTracker(budget),) if budget is not None else ()) + (
                (StyleTracker(styles),) if styles is not None else ())
            matcher = LLGuidanceMatcher(vocab, inner, shared, free, runs)
            matcher.spec = spec
            return matcher

        nbytes = _BASE_BYTES + 8 * len(grammar)
        return CompiledGrammar(backend=self.name, kind=spec.kind, make_matcher=make,
                               size_bytes=lambda: nbytes + shared.nbytes + (
                                   free.nbytes if free is not None else 0),
                               compile_s=time.perf_counter() - start)


def _refusal(spec: GrammarSpec, message: str) -> GrammarError:
    message = message.split("\n<state>")[0].strip()
    if "Unimplemented keys" in message or "unimplemented" in message.lower():
        return UnsupportedSchemaError(f"llguidance cannot enforce this schema: {message}")
    ours = translate(message, spec, "llguidance")
    if ours.message != message:
        return GrammarBackendError(ours.message, path=ours.path, backend="llguidance")
    return GrammarBackendError(f"llguidance refused the {spec.kind}: {message}",
                               backend="llguidance")
