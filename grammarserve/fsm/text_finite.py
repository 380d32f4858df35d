"""Refuse grammars with a rule that can be entered but never completed.

``root ::= "a" root`` matches no finite text, and in ``start: "x" | "a" loop`` / ``loop: "b"
loop`` the text ``a`` starts a value that never ends. xgrammar's jump-forward follows such a
rule for ever, allocating as it goes (the mechanism of issue 20's OOM); llguidance stops at its
item limit, with an error in the middle of the request. So a grammar is refused up front unless
every rule reachable from its start is *productive* (derives some finite text).

The analysis reads xgrammar's normalized form of the grammar (``str(xgrammar.Grammar)``): one
rule per line, ``name ::= ((a b) | (c))`` with string literals, character classes (``[...]``,
``[...]*``), rule references (``name``, ``name{m, n}``, ``n = -1`` unbounded), ``""`` and a
trailing lookahead ``(= ...)`` (ignored). That is the grammar xgrammar runs, for every kind it
compiles (EBNF, Lark, JSON schema, regex), so the same check guards its jump-forward whatever
the front end missed.
"""

from __future__ import annotations

import re

from grammarserve.errors import GrammarError

_RULE = re.compile(r"^([A-Za-z_][\w.-]*) ::= (.*)$")
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]\*?|\(=|[()|]|'
                    r"[A-Za-z_][\w.-]*(?:\{\s*(\d+)\s*,\s*-?\d+\s*\})?|\S")


def unproductive_rules(printed: str) -> list[str]:
    """Rules of xgrammar's normalized grammar text ``printed`` that are reachable from
    ``root`` and derive no finite text, in the order they are reached."""
    rules: dict[str, list[list[tuple[str, bool]]]] = {}
    for line in printed.splitlines():
        found = _RULE.match(line.strip())
        if found:
            rules[found.group(1)] = _alternatives(found.group(2))
    productive = _productive(rules)
    order, seen, stack = [], {"root"}, ["root"]
    while stack:
        name = stack.pop()
        if name not in rules:
            continue
        order.append(name)
        for alt in rules[name]:
            for ref, _ in alt:
                if ref not in seen:
                    seen.add(ref)
                    stack.append(ref)
    return [n for n in order if n not in productive]


def _productive(rules: dict[str, list[list[tuple[str, bool]]]]) -> set[str]:
    """The rules that derive some finite text: a worklist over the alternatives, each waiting
    on the count of its required references not yet known productive (linear in the grammar;
    a fixed point over all rules was quadratic on long rule chains)."""
    missing: dict[tuple[str, int], int] = {}
    waiting: dict[str, list[tuple[str, int]]] = {}
    productive: set[str] = set()
    todo: list[str] = []
    for name, alts in rules.items():
        for k, alt in enumerate(alts):
            needed = {ref for ref, required in alt if required and ref in rules}
            missing[(name, k)] = len(needed)
            for ref in needed:
                waiting.setdefault(ref, []).append((name, k))
            if not needed and name not in productive:
                productive.add(name)
                todo.append(name)
    while todo:
        for name, k in waiting.get(todo.pop(), ()):
            missing[(name, k)] -= 1
            if missing[(name, k)] == 0 and name not in productive:
                productive.add(name)
                todo.append(name)
    return productive


def _alternatives(body: str) -> list[list[tuple[str, bool]]]:
    """The alternatives of a rule body as lists of ``(rule reference, required)``; literals
    and classes always derive text, so only references matter. The normal form is
    ``((seq) | (seq))``; a reference in a deeper group (not in the normal form) counts as not
    required, which can only accept more."""
    alts: list[list[tuple[str, bool]]] = [[]]
    depth = 0
    lookahead_at: int | None = None
    for m in _TOKEN.finditer(body):
        tok = m.group(0)
        if tok == "(=":
            lookahead_at = depth
            depth += 1
        elif tok == "(":
            depth += 1
        elif tok == ")":
            depth -= 1
            if lookahead_at is not None and depth == lookahead_at:
                lookahead_at = None
        elif lookahead_at is not None:
            continue
        elif tok == "|":
            if depth <= 1:
                alts.append([])
        elif tok[0].isalpha() or tok[0] == "_":
            name = tok.split("{")[0]
            required = depth <= 2 and (m.group(1) is None or int(m.group(1)) > 0)
            alts[-1].append((name, required))
    return alts


def check_productive(printed: str, source: str = "", *, start: str = "root") -> None:
    """Raise ``GrammarError`` (path ``$.grammar``) naming a rule reachable from the start that
    can never be completed. ``source`` (the user's grammar text) lets the message name a rule
    the user wrote rather than one xgrammar derived from it (``item_1`` from ``item``);
    ``start`` is the user's name of xgrammar's ``root`` rule (Lark's ``start``)."""
    bad = unproductive_rules(printed)
    if not bad:
        return
    named = [n for n in bad if re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w.-])", source)]
    name = (named or bad)[0]
    if name == "root" or bad[0] == "root":
        name, what = start, "matches no finite text"
    else:
        what = "has a rule that can be entered but never completed"
    raise GrammarError(f"the grammar {what}: rule '{name}' can never be completed (every "
                       "alternative of it needs the rule again, directly or through other "
                       "rules, so no finite text matches it); give it an alternative that "
                       "ends", path="$.grammar")


def check_grammar_productive(text: str, syntax: str) -> None:
    """:func:`check_productive` on a Lark or EBNF (GBNF) grammar, read by xgrammar. A grammar
    xgrammar cannot read (an llguidance extension such as ``%json``) is left to llguidance,
    whose item limit bounds it."""
    import xgrammar as xgr  # NOTE: lazy, as the backends are

    try:
        grammar = xgr.Grammar.from_lark(text) if syntax == "lark" else xgr.Grammar.from_ebnf(text)
    except (RuntimeError, ValueError, TypeError):
        return
    check_productive(str(grammar), text, start="start" if syntax == "lark" else "root")
