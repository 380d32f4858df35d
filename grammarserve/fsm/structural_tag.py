"""Structural tags (xgrammar's format, as vLLM and SGLang take it in ``response_format``): free
text with tagged structures, checked and normalized here; ``structural_lark.py`` compiles the
result to an llguidance Lark grammar.

Two request shapes (``"type": "structural_tag"`` optional in both):

- legacy: ``{"structures": [{"begin", "schema", "end"}], "triggers": [...]}``: free text, and
  wherever the text reaches a trigger, one of the structures whose ``begin`` starts with it
  (begin, JSON valid under ``schema``, end), then free text again (``triggered_tags``);
- ``{"format": {...}}``: a tree of format objects (``StructuralFormat``).

Compiled exactly: ``const_string``, ``json_schema`` (style ``json``), ``regex``, ``grammar``
(EBNF), ``any_text``, ``sequence``, ``or``, ``optional``, ``plus``, ``star``, ``repeat``, ``tag``
(string ``begin`` and ``end``), ``triggered_tags``, ``tags_with_separator`` and ``dispatch``.
Refused, naming the type or field and its path: token-level formats (they match token ids), XML
argument styles, ``any_order``, ``any_text``'s length bounds, ``repeat`` counts over 1024, and
free text (``any_text``, ``triggered_tags``, ``dispatch``) other output follows: xgrammar ends
free text where the enclosing tag's ``end`` appears (or at the end of the output), which one
lexeme holds; free text followed by other output is ambiguous, which a lexeme cannot hold.

Every JSON schema passes the front end of ``response_format`` ``json_schema``, its refusals
naming the path inside the tag. The tag's size is bounded before its parts are read
(``GrammarLimits``: tags, triggers and format objects of the whole tag). The normalized tree: ``optional``/``plus``/``star`` as ``repeat``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from grammarserve.constraints import StructuralFormat as F
from grammarserve.fsm.limits import GrammarLimits
from grammarserve.fsm.structural_fields import count as _count
from grammarserve.fsm.structural_fields import excludes as _excludes
from grammarserve.fsm.structural_fields import fail as _fail
from grammarserve.fsm.structural_fields import flag as _flag
from grammarserve.fsm.structural_fields import items as _list
from grammarserve.fsm.structural_fields import kind_of as _kind
from grammarserve.fsm.structural_fields import only as _only
from grammarserve.fsm.structural_fields import string as _string
from grammarserve.fsm.structural_fields import strings as _strings

#: Where a format's output is followed from: the end of the output, the ``end`` of the ``tag``
#: whose content it ends, or other output (where free text cannot be compiled exactly).
Follow = Literal["eos", "ends", "open"]

#: Formats grammarserve refuses, and why.
_REFUSED: dict[F, str] = {
    **dict.fromkeys((F.TOKEN, F.EXCLUDE_TOKEN, F.ANY_TOKENS, F.TOKEN_TRIGGERED_TAGS,
                     F.TOKEN_DISPATCH),
                    "it matches token ids, and grammarserve's structural tags match text"),
    F.QWEN_XML_PARAMETER: "it writes arguments in Qwen's XML form, and grammarserve compiles "
                          "JSON (use json_schema with its default style 'json')",
}
_FIELDS: dict[F, tuple[str, ...]] = {
    F.CONST_STRING: ("value",), F.JSON_SCHEMA: ("json_schema", "style", "any_order",
                                                "max_whitespace_cnt"),
    F.GRAMMAR: ("grammar",), F.REGEX: ("pattern",),
    F.ANY_TEXT: ("excludes", "max_tokens", "max_chars"),
    F.SEQUENCE: ("elements",), F.OR: ("elements",), F.OPTIONAL: ("content",),
    F.PLUS: ("content",), F.STAR: ("content",), F.REPEAT: ("min", "max", "content"),
    F.TAG: ("begin", "content", "end"),
    F.TRIGGERED_TAGS: ("triggers", "tags", "at_least_one", "stop_after_first", "excludes"),
    F.TAGS_WITH_SEPARATOR: ("tags", "separator", "at_least_one", "stop_after_first"),
    F.DISPATCH: ("rules", "loop", "excludes"),
}
_MAX_REPEAT = 1024  # NOTE: llguidance took 56 s over the shortest text of ``min: 10000``
_REPEATS = {F.OPTIONAL: (0, 1), F.PLUS: (1, -1), F.STAR: (0, -1)}


@dataclass(frozen=True)
class TagChecks:
    """The grammar layer's own front ends, for what a structural tag embeds. Each takes the
    value and its path and returns the validated form, or raises ``GrammarError`` naming
    that path."""

    schema: Callable[[Any, str], dict[str, Any]]
    regex: Callable[[Any, str], str]
    grammar: Callable[[Any, str], str]


def normalize_structural_tag(tag: Any, checks: TagChecks, max_depth: int,
                             limits: GrammarLimits | None = None) -> dict[str, Any]:
    """The normalized format tree of a structural tag (either shape), ``{"format": {...}}``;
    raises ``GrammarError`` naming the problem and its path (``$`` is the tag object), a bound
    of ``limits`` (default ``GrammarLimits()``) exceeded included."""
    if isinstance(tag, str):
        try:
            tag = json.loads(tag)
        except ValueError as e:
            _fail("$", f"a structural tag given as text must be JSON: {e}")
    if not isinstance(tag, dict):
        _fail("$", f"a structural tag must be an object, got {_kind(tag)}")
    if tag.get("type", "structural_tag") != "structural_tag":
        _fail("$.type", f"must be 'structural_tag', got {tag.get('type')!r}")
    reader = _Reader(checks, max_depth, limits or GrammarLimits())
    legacy = "structures" in tag or "triggers" in tag
    if legacy and "format" in tag:
        _fail("$", "give either 'format' or the legacy 'structures' and 'triggers', not both")
    _only(tag, ("type", "structures", "triggers") if legacy else ("type", "format"), "$")
    if legacy:
        return {"format": reader.legacy(tag)}
    if "format" not in tag:
        _fail("$", "a structural tag needs 'format' (a format object), or the legacy "
                   "'structures' and 'triggers'")
    return {"format": reader.format(tag["format"], "$.format", "eos", 0)}


class _Reader:
    def __init__(self, checks: TagChecks, max_depth: int, limits: GrammarLimits) -> None:
        self.checks = checks
        self.max_depth = max_depth
        self.limits = limits
        self.spent = {"tags": 0, "triggers": 0, "format objects": 0}

    def spend(self, what: str, n: int, path: str) -> None:
        """Count ``n`` more ``what`` (tags, triggers, format objects) of the tag, refused at
        ``path`` past their bound (before they are read: the trigger checks are quadratic)."""
        self.spent[what] += n
        field = {"tags": "max_tags", "triggers": "max_triggers",
                 "format objects": "max_tag_formats"}[what]
        most = getattr(self.limits, field)
        if self.spent[what] > most:
            _fail(path, f"the structural tag has at least {self.spent[what]:,} {what}, "
                        f"more than this server's limit of {most:,} ({field})")

    def legacy(self, tag: dict[str, Any]) -> dict[str, Any]:
        if isinstance(tag.get("triggers"), list):
            self.spend("triggers", len(tag["triggers"]), "$.triggers")
        triggers = _strings(tag.get("triggers"), "$.triggers", nonempty=True)
        structures = tag.get("structures")
        if not isinstance(structures, list) or not structures:
            _fail("$.structures", "must be a non-empty list of {'begin', 'schema', 'end'}")
        self.spend("tags", len(structures), "$.structures")
        tags: list[dict[str, Any]] = []
        for i, s in enumerate(structures):
            where = f"$.structures[{i}]"
            if not isinstance(s, dict):
                _fail(where, f"must be an object {{'begin', 'schema', 'end'}}, got {_kind(s)}")
            _only(s, ("begin", "schema", "end"), where)
            if s.get("schema") is None:
                _fail(f"{where}.schema", "is required (a JSON schema; {} takes any JSON value)")
            begin = _string(s.get("begin"), f"{where}.begin")
            end = _string(s.get("end"), f"{where}.end")
            content = {"type": F.JSON_SCHEMA.value,
                       "json_schema": self.checks.schema(s["schema"], f"{where}.schema")}
            tags.append({"type": F.TAG.value, "begin": begin, "content": content, "end": [end]})
        _match_triggers(triggers, [t["begin"] for t in tags], "$.triggers",
                        [f"$.structures[{i}].begin" for i in range(len(tags))])
        return {"type": F.TRIGGERED_TAGS.value, "triggers": triggers, "tags": tags,
                "at_least_one": False, "stop_after_first": False, "excludes": []}

    def format(self, value: Any, path: str, follow: Follow, depth: int) -> dict[str, Any]:
        if depth > self.max_depth:
            _fail(path, f"the structural tag is nested too deeply (this server's limit is "
                        f"{self.max_depth} levels)")
        if not isinstance(value, dict):
            _fail(path, f"a format must be an object with a 'type', got {_kind(value)}")
        self.spend("format objects", 1, path)
        name = value.get("type")
        try:
            kind = F(name)
        except ValueError:
            known = ", ".join(f.value for f in F if f not in _REFUSED)
            _fail(f"{path}.type", f"unknown format type {name!r} (grammarserve compiles "
                                  f"{known})")
        if kind in _REFUSED:
            _fail(path, f"format type '{kind.value}' is not supported by grammarserve: "
                        f"{_REFUSED[kind]}")
        _only(value, ("type", *_FIELDS[kind]), path)
        if kind in _REPEATS:
            return self._repeated(value, path, follow, depth + 1, *_REPEATS[kind])
        read: Callable[..., dict[str, Any]] = getattr(self, f"_{kind.value}")
        return read(value, path, follow, depth + 1)

    # -- primitives -----------------------------------------------------------------------
    def _const_string(self, v: dict[str, Any], path: str, follow: Follow, depth: int
                      ) -> dict[str, Any]:
        value = v.get("value")
        if not isinstance(value, str):
            _fail(f"{path}.value", f"must be a string, got {_kind(value)}")
        return {"type": F.CONST_STRING.value, "value": value}

    def _json_schema(self, v: dict[str, Any], path: str, follow: Follow, depth: int
                     ) -> dict[str, Any]:
        if v.get("style", "json") != "json":
            _fail(f"{path}.style", f"style {v['style']!r} is not supported by grammarserve "
                                   "(its XML argument forms are not compiled); use 'json'")
        if v.get("any_order", False) is not False:
            _fail(f"{path}.any_order", "any_order is not supported by grammarserve (keys are "
                                       "generated in the schema's order)")
        if v.get("max_whitespace_cnt") is not None:
            _fail(f"{path}.max_whitespace_cnt", "is set by the server for every JSON value "
                                                "(--grammar-max-whitespace); leave it out")
        if "json_schema" not in v:
            _fail(f"{path}.json_schema", "is required (a JSON schema)")
        schema = v["json_schema"]
        if schema is True:
            schema = {}
        return {"type": F.JSON_SCHEMA.value,
                "json_schema": self.checks.schema(schema, f"{path}.json_schema")}

    def _regex(self, v: dict[str, Any], path: str, follow: Follow, depth: int) -> dict[str, Any]:
        pattern = _string(v.get("pattern"), f"{path}.pattern")
        return {"type": F.REGEX.value, "pattern": self.checks.regex(pattern, f"{path}.pattern")}

    def _grammar(self, v: dict[str, Any], path: str, follow: Follow, depth: int
                 ) -> dict[str, Any]:
        text = _string(v.get("grammar"), f"{path}.grammar")
        return {"type": F.GRAMMAR.value, "grammar": self.checks.grammar(text, f"{path}.grammar")}

    def _any_text(self, v: dict[str, Any], path: str, follow: Follow, depth: int
                  ) -> dict[str, Any]:
        _free_here(F.ANY_TEXT, path, follow)
        for bound in ("max_tokens", "max_chars"):
            if v.get(bound) is not None:
                # NOTE: a counted text next to the excluded strings and the enclosing end
                # made llguidance's lexer give up ("too many expressions constructed") from
                # 128 characters on, so no length bound is compiled rather than a fragile one
                _fail(f"{path}.{bound}", "a length bound on free text is not supported by "
                                         "grammarserve; leave it out (the request's max_tokens "
                                         "bounds the reply)")
        return {"type": F.ANY_TEXT.value, "excludes": _excludes(v, path)}

    # -- composition ----------------------------------------------------------------------
    def _sequence(self, v: dict[str, Any], path: str, follow: Follow, depth: int
                  ) -> dict[str, Any]:
        items = _list(v.get("elements"), f"{path}.elements")
        last = len(items) - 1
        return {"type": F.SEQUENCE.value, "elements": [
            self.format(e, f"{path}.elements[{i}]", follow if i == last else "open", depth)
            for i, e in enumerate(items)]}

    def _or(self, v: dict[str, Any], path: str, follow: Follow, depth: int) -> dict[str, Any]:
        items = _list(v.get("elements"), f"{path}.elements")
        return {"type": F.OR.value, "elements": [
            self.format(e, f"{path}.elements[{i}]", follow, depth) for i, e in enumerate(items)]}

    def _repeat(self, v: dict[str, Any], path: str, follow: Follow, depth: int
                ) -> dict[str, Any]:
        low = _count(v.get("min"), f"{path}.min", _MAX_REPEAT)
        high = v.get("max")
        if high != -1:
            high = _count(high, f"{path}.max", _MAX_REPEAT)
            if high < low:
                _fail(f"{path}.max", f"must be -1 (unbounded) or at least min ({low}), got "
                                     f"{high}")
        return self._repeated(v, path, follow, depth, low, high)

    def _repeated(self, v: dict[str, Any], path: str, follow: Follow, depth: int, low: int,
                  high: int) -> dict[str, Any]:
        # NOTE: at most once, the content ends where the repeat ends; repeated, other copies
        # of it follow it.
        if "content" not in v:
            _fail(f"{path}.content", "is required (a format object)")
        inner = self.format(v["content"], f"{path}.content", follow if high in (0, 1) else "open",
                            depth)
        return {"type": F.REPEAT.value, "min": low, "max": high, "content": inner}

    # -- tags -----------------------------------------------------------------------------
    def _tag(self, v: dict[str, Any], path: str, follow: Follow, depth: int) -> dict[str, Any]:
        if v.get("type", "tag") != "tag":
            _fail(f"{path}.type", f"must be 'tag', got {v.get('type')!r}")
        _only(v, ("type", *_FIELDS[F.TAG]), path)
        begin = v.get("begin")
        if isinstance(begin, dict):
            _fail(f"{path}.begin", "a token as 'begin' is not supported by grammarserve (it "
                                   "matches token ids); give a string")
        begin = _string(begin, f"{path}.begin", nonempty=False)
        end = v.get("end")
        if isinstance(end, dict):
            _fail(f"{path}.end", "a token as 'end' is not supported by grammarserve (it matches "
                                 "token ids); give a string or a list of strings")
        ends = [end] if isinstance(end, str) else _strings(end, f"{path}.end", nonempty=True,
                                                           empty_items=True)
        if "" in ends and len(ends) > 1:
            _fail(f"{path}.end", "an empty string among several 'end' strings is not supported")
        if len(set(ends)) != len(ends):
            _fail(f"{path}.end", "the 'end' strings must be distinct")
        if "content" not in v:
            _fail(f"{path}.content", "is required (a format object)")
        inner = self.format(v["content"], f"{path}.content", follow if ends == [""] else "ends",
                            depth)
        return {"type": F.TAG.value, "begin": begin, "content": inner, "end": ends}

    def _tags(self, v: dict[str, Any], path: str, depth: int) -> list[dict[str, Any]]:
        items = _list(v.get("tags"), f"{path}.tags")
        self.spend("tags", len(items), f"{path}.tags")
        tags = []
        for i, t in enumerate(items):
            where = f"{path}.tags[{i}]"
            if not isinstance(t, dict):
                _fail(where, f"must be a tag object {{'begin', 'content', 'end'}}, got "
                             f"{_kind(t)}")
            tags.append(self._tag(t, where, "open", depth + 1))
        return tags

    def _triggered_tags(self, v: dict[str, Any], path: str, follow: Follow, depth: int
                        ) -> dict[str, Any]:
        once = _flag(v, "at_least_one", path) and _flag(v, "stop_after_first", path)
        if not once:  # NOTE: otherwise it may end in free text
            _free_here(F.TRIGGERED_TAGS, path, follow)
        triggers = _strings(v.get("triggers"), f"{path}.triggers", nonempty=True)
        self.spend("triggers", len(triggers), f"{path}.triggers")
        tags = self._tags(v, path, depth)
        _match_triggers(triggers, [t["begin"] for t in tags], f"{path}.triggers",
                        [f"{path}.tags[{i}].begin" for i in range(len(tags))])
        return {"type": F.TRIGGERED_TAGS.value, "triggers": triggers, "tags": tags,
                "at_least_one": _flag(v, "at_least_one", path),
                "stop_after_first": _flag(v, "stop_after_first", path),
                "excludes": _excludes(v, path)}

    def _tags_with_separator(self, v: dict[str, Any], path: str, follow: Follow, depth: int
                             ) -> dict[str, Any]:
        separator = v.get("separator")
        if not isinstance(separator, str):
            _fail(f"{path}.separator", f"must be a string, got {_kind(separator)}")
        return {"type": F.TAGS_WITH_SEPARATOR.value, "tags": self._tags(v, path, depth),
                "separator": separator, "at_least_one": _flag(v, "at_least_one", path),
                "stop_after_first": _flag(v, "stop_after_first", path)}

    def _dispatch(self, v: dict[str, Any], path: str, follow: Follow, depth: int
                  ) -> dict[str, Any]:
        _free_here(F.DISPATCH, path, follow)
        rules = _list(v.get("rules"), f"{path}.rules")
        self.spend("triggers", len(rules), f"{path}.rules")
        out: list[tuple[str, dict[str, Any]]] = []
        for i, rule in enumerate(rules):
            where = f"{path}.rules[{i}]"
            if not isinstance(rule, list) or len(rule) != 2:
                _fail(where, "must be a pair [pattern, format]")
            pattern = _string(rule[0], f"{where}[0]")
            out.append((pattern, self.format(rule[1], f"{where}[1]", "open", depth)))
        patterns = [p for p, _ in out]
        _distinct_triggers(patterns, [f"{path}.rules[{i}][0]" for i in range(len(out))])
        loop = v.get("loop", True)
        if not isinstance(loop, bool):
            _fail(f"{path}.loop", f"must be a boolean, got {_kind(loop)}")
        return {"type": F.DISPATCH.value, "rules": [list(r) for r in out], "loop": loop,
                "excludes": _excludes(v, path)}


def _free_here(kind: F, path: str, follow: Follow) -> None:
    if follow == "open":
        _fail(path, f"'{kind.value}' is free text, and grammarserve compiles free text only "
                    "where it ends the output or the content of a 'tag' (whose 'end' ends it); "
                    "here other output follows it")


def _match_triggers(triggers: list[str], begins: list[str], where: str,
                    begin_paths: list[str]) -> None:
    """Each tag's ``begin`` starts with exactly one trigger, and each trigger starts a tag."""
    _distinct_triggers(triggers, [f"{where}[{i}]" for i in range(len(triggers))])
    used: set[str] = set()
    for begin, path in zip(begins, begin_paths, strict=True):
        found = [t for t in triggers if begin.startswith(t)]
        if not found:
            _fail(path, f"the begin {begin!r} starts with none of the triggers {triggers}")
        used.update(found)
    for i, t in enumerate(triggers):
        if t not in used:
            _fail(f"{where}[{i}]", f"no tag's begin starts with the trigger {t!r} (once written, "
                                   "nothing could follow it)")


def _distinct_triggers(triggers: list[str], paths: list[str]) -> None:
    """No trigger holds another: where both could fire, which one dispatches is ambiguous."""
    for i, t in enumerate(triggers):
        for j, other in enumerate(triggers):
            if i != j and other in t and (other != t or j < i):
                _fail(paths[i], f"the trigger {t!r} contains the trigger {other!r} "
                                f"({paths[j]}): which one dispatches would be ambiguous")
