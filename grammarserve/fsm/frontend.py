"""The grammar layer's front ends: each ``compile_*`` call's arguments checked and turned into a
:class:`GrammarSpec` (JSON schemas through meta-validation, rewrites, value checks, strict mode,
closing and sharing; regexes, Lark/EBNF grammars, choices, tool formats and structural tags
through their own checks). No backend is involved: a spec's errors are the input's own faults."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from grammarserve.constraints import ConstraintKind, GrammarSyntax
from grammarserve.errors import GrammarError
from grammarserve.fsm import text_grammars
from grammarserve.fsm.config import GrammarConfig, GrammarSpec, SpecKind, canonical_json
from grammarserve.fsm.runs import MAX_DIGITS
from grammarserve.fsm.schema.close import has_long_numbers
from grammarserve.fsm.schema.depth import check_text_depth
from grammarserve.fsm.schema.prepare import Preparation, prepare
from grammarserve.fsm.schema.share import share_leaves
from grammarserve.fsm.structural_tag import TagChecks, normalize_structural_tag
from grammarserve.fsm.text_finite import check_grammar_productive
from grammarserve.fsm.tools import normalize_tools
from grammarserve.fsm.value_check import ValueCheck


class SpecBuilder:
    """Builds :class:`GrammarSpec` objects under one :class:`GrammarConfig`."""

    def __init__(self, config: GrammarConfig) -> None:
        self.config = config

    def spec(self, kind: ConstraintKind | str, *args: Any, **kwargs: Any) -> GrammarSpec:
        """The validated spec of a ``compile_*`` call's arguments (``kind`` as in
        ``GrammarCompiler.compile_async``); raises ``GrammarError`` naming the problem."""
        builders: dict[ConstraintKind, Callable[..., GrammarSpec]] = {
            ConstraintKind.JSON_SCHEMA: self.json_spec, ConstraintKind.REGEX: self._regex_spec,
            ConstraintKind.GRAMMAR: self._grammar_spec, ConstraintKind.CHOICE: self._choice_spec,
            ConstraintKind.TOOL_CALLS: self._tools_spec,
            ConstraintKind.STRUCTURAL_TAG: self._structural_spec,
        }
        if kind not in builders:
            raise ValueError(f"unknown grammar kind {kind!r}; use one of "
                             f"{sorted(k.value for k in builders)}")
        return builders[ConstraintKind(kind)](*args, **kwargs)

    def _json_options(self, source: str) -> tuple[tuple[str, Any], ...]:
        c = self.config
        digits = None if c.open_schemas or has_long_numbers(source) else MAX_DIGITS
        options = (("json_style", c.json_style), ("max_digits", digits),
                   ("max_whitespace", c.max_whitespace))
        return options if c.force_tokenization else (*options, ("force_tokenization", False))

    def _check_schema(self, schema: Any, strict: bool, path: str = "$",
                      checks: list[ValueCheck] | None = None, lean: bool = False
                      ) -> dict[str, Any]:
        """The schema the grammar is compiled from (``schema/prepare.py``); with ``checks`` (a
        list), what no grammar can hold may be left to run-time checks, appended to it
        (``lean``: conditions too). A refusal names its place under ``path``."""
        c = self.config
        how = Preparation(strict=strict, value_checks=checks is not None, lean=lean,
                          open_schemas=c.open_schemas, backend=c.backend,
                          max_depth=c.limits.max_depth)
        try:
            prepared, found = prepare(schema, how)
        except GrammarError as e:
            if path != "$":
                e.path = path + (e.path or "$")[1:]
                e.args = (f"{path}: {e.args[0]}",)
            raise
        if checks is not None:
            checks.extend(found)
        return prepared

    def json_spec(self, schema: Any, *, strict: bool = False, lean: bool = False
                   ) -> GrammarSpec:
        checks: list[ValueCheck] | None = [] if self.config.value_checks and not strict \
            else None
        prepared = self._check_schema(schema, strict, checks=checks, lean=lean)
        source = canonical_json(share_leaves(prepared))  # NOTE: see share.py
        return GrammarSpec(ConstraintKind.JSON_SCHEMA, source,
                           self._json_options(source) + (("strict", strict),),
                           tuple(checks or ()), origin=None if lean else schema)

    def lean(self, spec: GrammarSpec) -> GrammarSpec | None:
        """For a JSON schema the backends refused: the spec of its ``lean`` rewrite (conditions
        as run-time checks instead of cases, ``rewrite.rewrite_schema``), if that differs."""
        if spec.kind != ConstraintKind.JSON_SCHEMA or spec.origin is None \
                or not self.config.value_checks or spec.option("strict"):
            return None
        try:
            lean = self.json_spec(spec.origin, lean=True)
        except GrammarError:
            return None
        return lean if lean.source != spec.source else None

    def _regex_spec(self, pattern: str) -> GrammarSpec:
        if isinstance(pattern, str):
            check_text_depth(pattern, self.config.limits.max_depth, what="the regex",
                             path="$.regex")
        checked = text_grammars.check_regex(pattern, self.config.limits)
        return GrammarSpec(ConstraintKind.REGEX, checked)

    def _grammar_spec(self, text: str, *, syntax: GrammarSyntax | str = GrammarSyntax.LARK
                      ) -> GrammarSpec:
        kind: SpecKind
        try:
            kind = GrammarSyntax(syntax)
        except ValueError:
            raise GrammarError(f"grammar syntax must be 'lark' or 'ebnf', got {syntax!r}",
                               path="$.syntax") from None
        if isinstance(text, str):
            check_text_depth(text, self.config.limits.max_depth, what="the grammar",
                             path="$.grammar", quotes='"')
        limits = self.config.limits
        text = (text_grammars.check_lark(text, limits) if kind is GrammarSyntax.LARK
                else text_grammars.check_ebnf(text, limits))
        check_grammar_productive(text, kind)
        return GrammarSpec(kind, text)

    def _choice_spec(self, options: list[str]) -> GrammarSpec:
        choices = json.dumps(text_grammars.check_choice(options))
        return GrammarSpec(ConstraintKind.CHOICE, choices)

    def _tools_spec(self, tools: list[dict[str, Any]], mode: Any = "required", *,
                    parallel: bool = True, call_format: str = "hermes") -> GrammarSpec:
        spec = normalize_tools(tools, mode, parallel=parallel, check_schema=self._check_schema,
                               fmt=call_format, limits=self.config.limits)
        source = canonical_json(spec)
        return GrammarSpec(ConstraintKind.TOOL_CALLS, source, self._json_options(source))

    def _structural_spec(self, tag: Any) -> GrammarSpec:
        checks = TagChecks(schema=lambda schema, path: self._check_schema(schema, False, path),
                           regex=lambda pattern, path: _at(path, self._regex_spec, pattern),
                           grammar=lambda text, path: _at(
                               path, functools.partial(self._grammar_spec,
                                                       syntax=GrammarSyntax.EBNF), text))
        tree = normalize_structural_tag(tag, checks, self.config.limits.max_depth,
                                        self.config.limits)
        source = canonical_json(tree)
        return GrammarSpec(ConstraintKind.STRUCTURAL_TAG, source, self._json_options(source))


def _at(path: str, check: Callable[[str], GrammarSpec], text: str) -> str:
    """``check(text)``'s validated source, its refusal naming ``path`` instead of its own."""
    try:
        return check(text).source
    except GrammarError as e:
        own = e.path or "$"
        e.path = path
        e.args = (f"{path}: {str(e).replace(own, path)}",)
        raise
