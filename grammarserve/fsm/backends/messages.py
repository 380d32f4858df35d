"""The backends' messages in our terms: what was hit and where in the input.

A backend refuses or stops with its own internals (llguidance: ``Parser Error: Current row
has 7999 items; max is 2000; consider making your grammar left-recursive...``, a Rust regex
parse error with a caret line; xgrammar: ``regex_converter.cc:94: Regex parsing error at
position 4``). :func:`translate` recognizes them and says instead which limit of this server
was hit (the ``GrammarLimits`` field and its value) or which pattern the backend cannot read,
with the JSON path of the part of the schema that causes it; a message it does not know is
kept (shorn of llguidance's state dump).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from grammarserve.constraints import ConstraintKind, GrammarSyntax
from grammarserve.fsm.config import GrammarSpec
from grammarserve.fsm.schema.tree import iter_subschemas, json_path

_ROW = re.compile(r"Current row has (\d+) items; max is (\d+)")
_STEP = re.compile(r"Too many items \(limit (\d+)\)")
_FUEL = re.compile(r"fuel", re.IGNORECASE)
_LEXER_STATES = re.compile(r"lexer states|too many states", re.IGNORECASE)
_GRAMMAR_SIZE = re.compile(r"grammar (?:size|too large)|schema too large", re.IGNORECASE)
_RUST_REGEX = re.compile(r"regex parse error:[ \t]*\n(?P<regex>[^\n]*)\n(?P<caret>[ \t]*\^+)\s*\n"
                         r"\s*error: (?P<what>[^\n]+)")
_LLG_REGEX = re.compile(r'invalid regex "(?P<regex>(?:[^"\\]|\\.)*)"[^:]*: (?P<what>[^\n]+)')
_XGR_REGEX = re.compile(r"Regex parsing error at position (?P<pos>\d+): (?P<what>[^\n]+)")


@dataclass(frozen=True)
class Translated:
    """A backend message in our terms: the message, the JSON path it names (if known) and
    whether it is a limit of this server (else the input's own fault)."""

    message: str
    path: str | None
    limit: bool = False


def translate(message: str, spec: GrammarSpec | None, backend: str) -> Translated:
    """``message`` of ``backend`` about ``spec`` in our terms (see the module docstring)."""
    message = message.split("\n<state>")[0].strip()
    schema = _schema(spec)
    found = _ROW.search(message)
    if found:
        where = _widest(schema)
        return Translated(
            f"the constraint is too wide for the grammar parser: one step would hold "
            f"{found.group(1)} alternatives at once, over this server's limit of "
            f"{found.group(2)} (max_items_in_row){_widest_text(where)}", where[0], True)
    found = _STEP.search(message)
    if found:
        where = _widest(schema)
        return Translated(
            f"the constraint needs too much work in one parser step: over this server's limit "
            f"of {found.group(1)} items per step (step_max_items){_widest_text(where)}",
            where[0], True)
    for limit, name in ((_FUEL, "lexer work (initial_lexer_fuel, step_lexer_fuel)"),
                        (_LEXER_STATES, "lexer states (max_lexer_states)"),
                        (_GRAMMAR_SIZE, "grammar size (max_grammar_size)")):
        if limit.search(message):
            where = _widest(schema)
            return Translated(f"the constraint is over this server's limit of {name}"
                              f"{_widest_text(where)} ({backend}: {_first_line(message)})",
                              where[0], True)
    pattern = _regex_error(message)
    if pattern is not None:
        text, what, pos = pattern
        path = _pattern_path(spec, schema, text)
        at = f" at position {pos}" if pos is not None else ""
        of = f" {text!r}" if text is not None else ""
        place = f" at {path}" if path else ""
        return Translated(f"the grammar backend ({backend}) cannot read the pattern{of}"
                          f"{place}: {what}{at}", path)
    return Translated(message, None)


def _first_line(message: str) -> str:
    return message.split("\n")[0][:200]


def _schema(spec: GrammarSpec | None) -> Any:
    if spec is None or spec.kind not in (ConstraintKind.JSON_SCHEMA, ConstraintKind.TOOL_CALLS):
        return None
    origin = spec.origin if spec.kind == ConstraintKind.JSON_SCHEMA else None
    try:
        if isinstance(origin, str):
            return json.loads(origin)
        return origin if origin is not None else json.loads(spec.source)
    except (ValueError, RecursionError):
        return None


def _regex_error(message: str) -> tuple[str | None, str, int | None] | None:
    """(the regex, what is wrong, its position) of a regex parse error, or None."""
    found = _RUST_REGEX.search(message)
    if found:
        regex = found.group("regex")
        offset = len(found.group("caret")) - len(found.group("caret").lstrip())
        indent = len(regex) - len(regex.lstrip())
        return regex.strip(), found.group("what").strip(), max(0, offset - indent)
    found = _LLG_REGEX.search(message)
    if found:
        try:
            regex = json.loads(f'"{found.group("regex")}"')
        except ValueError:
            regex = found.group("regex")
        return regex, found.group("what").strip(), None
    found = _XGR_REGEX.search(message)
    if found:
        return None, found.group("what").strip().rstrip("."), int(found.group("pos"))
    return None


def _patterns(schema: Any) -> Iterator[tuple[str, str]]:
    """(pattern, JSON path) of every ``pattern`` and ``patternProperties`` name."""
    for sub, parts in iter_subschemas(schema):
        if isinstance(sub.get("pattern"), str):
            yield sub["pattern"], json_path(parts + ("pattern",))
        if isinstance(sub.get("patternProperties"), dict):
            for name in sub["patternProperties"]:
                yield name, json_path(parts + ("patternProperties", name))


def _pattern_path(spec: GrammarSpec | None, schema: Any, regex: str | None) -> str | None:
    if spec is not None and spec.kind == ConstraintKind.REGEX:
        return "$.regex"
    if spec is not None and spec.kind in (GrammarSyntax.LARK, GrammarSyntax.EBNF):
        return "$.grammar"
    found = list(_patterns(schema)) if isinstance(schema, dict) else []
    exact = [path for p, path in found if regex is not None and p == regex]
    if exact:
        return exact[0]
    return found[0][1] if len(found) == 1 else None


def _widest(schema: Any) -> tuple[str | None, str]:
    """The path and a description of the widest part of ``schema``: the most optional
    properties, ``anyOf``/``oneOf`` branches or ``enum`` values in one place."""
    best: tuple[int, str | None, str] = (0, None, "")
    if not isinstance(schema, (dict, list)):
        return None, ""
    for sub, parts in iter_subschemas(schema):
        props = sub.get("properties")
        if isinstance(props, dict):
            required = sub.get("required")
            named = set(required) if isinstance(required, list) else set()
            optional = len(set(props) - named)
            if optional > best[0]:
                best = (optional, json_path(parts + ("properties",)),
                        f"{optional} optional properties")
        for key in ("anyOf", "oneOf", "enum"):
            value = sub.get(key)
            if isinstance(value, list) and len(value) > best[0]:
                noun = "values" if key == "enum" else "branches"
                best = (len(value), json_path(parts + (key,)), f"{len(value)} {noun}")
    return best[1], best[2]


def _widest_text(where: tuple[str | None, str]) -> str:
    path, what = where
    if path is None:
        return ""
    return (f"; the widest part is {path} ({what}): make fewer of them optional or split "
            "the schema")
