"""A normalized structural tag (``structural_tag.py``) as one llguidance grammar: a Lark grammar
with ``%json`` schemas, plus a subgrammar per EBNF ``grammar`` format.

Free text is one lexeme that runs up to what ends it, as in the Hermes ``auto`` tool-call
grammar (``tools.py``), so no trigger detection happens outside the grammar and a token may
straddle any boundary:

- before a trigger ``t`` (``triggered_tags``, ``dispatch``): ``.*t`` in which no trigger, no
  exclude and no enclosing ``end`` occurs except that final ``t`` (the first trigger to appear
  dispatches, as xgrammar's Aho-Corasick does), then the rest of a tag that begins with ``t``;
- at the end of the output: text without a trigger, an exclude or (inside a tag) its ``end``;
- at the end of a tag's content: that text, then one of the tag's ``end`` strings, as one
  lexeme (the first ``end`` to appear closes the tag: xgrammar excludes the enclosing ``end``
  from the free text inside).

``ends`` below are the strings a node's output must be followed by (the enclosing tag's
``end``), which the node writes itself; ``()``: nothing (the end of the output, or other
output, where the front end let only formats that do not end in free text through).
"""

from __future__ import annotations

import json
from typing import Any

from llguidance.gbnf_to_lark import any_to_lark

from grammarserve.constraints import StructuralFormat as F

_ANY = "/(?s:.*)/"
_EPSILON = '""'


def structural_tag_grammar(tree: dict[str, Any], json_options: dict[str, Any], *,
                           no_forcing: bool = False) -> str:
    """The llguidance grammar (``{"grammars": [...]}`` JSON text) of a normalized tag;
    ``json_options`` go into every embedded schema's ``x-guidance`` (replacing the user's);
    ``no_forcing``: llguidance lets the model spell forced text with any tokens."""
    build = _Builder(json_options)
    start = build.node(tree["format"], ())
    head = ['%llguidance {"no_forcing": true}'] if no_forcing else []
    main = "\n".join([*head, f"start: {start}", *build.lines]) + "\n"
    return json.dumps({"grammars": [{"name": "structural_tag", "lark_grammar": main},
                                    *build.subgrammars]}, ensure_ascii=False)


def _q(text: str) -> str:
    """A Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def _alts(texts: Any) -> str:
    return "(" + " | ".join(_q(t) for t in texts) + ")"


def _join(*parts: str) -> str:
    kept = [p for p in parts if p and p != _EPSILON]
    return " ".join(kept) if kept else _EPSILON


def _lark_regex(pattern: str) -> str:
    """``pattern`` as a Lark ``/.../`` literal (unescaped slashes escaped)."""
    out, escaped = [], False
    for ch in pattern:
        if ch == "/" and not escaped:
            out.append("\\/")
        else:
            out.append(ch)
        escaped = ch == "\\" and not escaped
    return "/" + "".join(out) + "/"


class _Builder:
    def __init__(self, json_options: dict[str, Any]) -> None:
        self.json_options = json_options
        self.lines: list[str] = []
        self.subgrammars: list[dict[str, str]] = []
        self._terminals: dict[str, str] = {}
        self._count = 0

    def _name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def rule(self, body: str) -> str:
        name = self._name("r")
        self.lines.append(f"{name}: {body}")
        return name

    def terminal(self, body: str) -> str:
        """A named terminal (one lexeme); equal bodies share one name."""
        if body not in self._terminals:
            name = self._name("T")
            self._terminals[body] = name
            self.lines.append(f"{name}: {body}")
        return self._terminals[body]

    def lit(self, ends: tuple[str, ...]) -> str:
        if not ends:
            return _EPSILON
        return _q(ends[0]) if len(ends) == 1 else _alts(ends)

    # -- free text -------------------------------------------------------------------------
    def free(self, excludes: list[str]) -> str:
        """Text in which no string of ``excludes`` occurs."""
        if not excludes:
            return self.terminal(_ANY)
        return self.terminal(f"{_ANY} & ~({_ANY} {_alts(sorted(set(excludes)))} {_ANY})")

    def closed(self, excludes: list[str], ends: tuple[str, ...]) -> str:
        """Free text (no ``excludes``, no ``ends``), then one of ``ends``; at the end of the
        output (``ends`` empty), the free text alone."""
        free = self.free([*excludes, *ends])
        return self.terminal(f"{free} {self.lit(ends)}") if ends else free

    def head(self, trigger: str, stops: list[str]) -> str:
        """Free text up to and with ``trigger``, in which no string of ``stops`` (the
        triggers among them) occurs before its end."""
        return self.terminal(f"({_ANY} {_q(trigger)}) & ~({_ANY} {_alts(sorted(set(stops)))} "
                             "/(?s:.+)/)")

    # -- formats ---------------------------------------------------------------------------
    def node(self, n: dict[str, Any], ends: tuple[str, ...]) -> str:
        kind = F(n["type"])
        if kind is F.CONST_STRING:
            return _join(_q(n["value"]) if n["value"] else "", self.lit(ends))
        if kind is F.JSON_SCHEMA:
            schema = {**n["json_schema"], "x-guidance": self.json_options}
            return _join(self.rule("%json " + json.dumps(schema, ensure_ascii=False)),
                         self.lit(ends))
        if kind is F.REGEX:
            return _join(self.terminal(_lark_regex(n["pattern"])), self.lit(ends))
        if kind is F.GRAMMAR:
            name = self._name("g")
            self.subgrammars.append({"name": name, "lark_grammar": any_to_lark(n["grammar"])})
            return _join(f"@{name}", self.lit(ends))
        if kind is F.ANY_TEXT:
            return self.closed(n["excludes"], ends)
        if kind is F.SEQUENCE:
            last = len(n["elements"]) - 1
            return _join(*(self.node(e, ends if i == last else ())
                           for i, e in enumerate(n["elements"])))
        if kind is F.OR:
            return self.rule(" | ".join(self.node(e, ends) for e in n["elements"]))
        if kind is F.REPEAT:
            return self.repeat(n, ends)
        if kind is F.TAG:
            if n["end"] == [""]:
                return _join(_q(n["begin"]) if n["begin"] else "", self.node(n["content"], ends))
            return _join(self.tag(n), self.lit(ends))
        if kind is F.TRIGGERED_TAGS:
            return self.triggered(n, ends)
        if kind is F.TAGS_WITH_SEPARATOR:
            return _join(self.separated(n), self.lit(ends))
        if kind is F.DISPATCH:
            rules = [(p, self.node(f, ())) for p, f in n["rules"]]
            stops = [p for p, _ in rules] + n["excludes"] + list(ends)
            segment = self.rule(" | ".join(f"{self.head(p, stops)} {rest}" for p, rest in rules))
            tail = self.closed([p for p, _ in rules] + n["excludes"], ends)
            if n["loop"]:
                return _join(f"{segment}*", tail)
            return self.rule(f"{tail} | {_join(segment, self.lit(ends))}")
        raise AssertionError(f"not a normalized format: {kind}")

    def repeat(self, n: dict[str, Any], ends: tuple[str, ...]) -> str:
        low, high = n["min"], n["max"]
        if high == 0:
            return self.lit(ends)
        if high == 1:  # NOTE: the content ends where the repeat ends (see the front end)
            inner = self.node(n["content"], ends)
            return inner if low == 1 else self.rule(f"{inner} | {self.lit(ends)}")
        item = self.rule(self.node(n["content"], ()))
        if high == -1:
            count = "*" if low == 0 else "+" if low == 1 else f"{{{low},}}"
        else:
            count = f"{{{low},{high}}}"
        return _join(f"{item}{count}", self.lit(ends))

    def tag(self, n: dict[str, Any], skip: int = 0) -> str:
        """A tag with its own end, its ``begin`` from byte ``skip`` on (after a trigger)."""
        begin = n["begin"][skip:]
        own = () if n["end"] == [""] else tuple(n["end"])
        return _join(_q(begin) if begin else "", self.node(n["content"], own))

    def triggered(self, n: dict[str, Any], ends: tuple[str, ...]) -> str:
        triggers: list[str] = n["triggers"]
        if n["at_least_one"] and n["stop_after_first"]:
            return _join(self.first(n), self.lit(ends))
        stops = triggers + n["excludes"] + list(ends)
        segments = []
        for trigger in triggers:
            rest = [self.tag(t, len(trigger)) for t in n["tags"] if t["begin"].startswith(trigger)]
            segments.append(f"{self.head(trigger, stops)} {self.rule(' | '.join(rest))}")
        segment = self.rule(" | ".join(segments))
        tail = self.closed(triggers + n["excludes"], ends)
        if n["stop_after_first"]:
            return self.rule(f"{tail} | {_join(segment, self.lit(ends))}")
        loop = _join(f"{segment}*", tail)
        return _join(self.first(n), loop) if n["at_least_one"] else loop

    def first(self, n: dict[str, Any]) -> str:
        """One of the tags, with no free text before it."""
        return self.rule(" | ".join(self.tag(t) for t in n["tags"]))

    def separated(self, n: dict[str, Any]) -> str:
        tag = self.rule(" | ".join(self.tag(t) for t in n["tags"]))
        if n["stop_after_first"]:
            return tag if n["at_least_one"] else f"{tag}?"
        sep = n["separator"]
        more = self.rule(f"{tag} ({_q(sep)} {tag})*") if sep else f"{tag}+"
        return more if n["at_least_one"] else f"({more})?"
