"""Nesting depth of JSON values and texts, measured without recursion.

A request may nest JSON (or a regex's groups) as deep as its bytes allow; every recursive walker
further in (``json.loads``, ``jsonschema``, the front end's rewrites, ``re``, ``lark``, the
backends' parsers) has a limit of its own, reached as a ``RecursionError`` or a native stack
overflow. So depth is measured first, here, by loops only, and refused with a message that names
the limit.

Depth counts containers: ``1`` is 0 deep, ``[1]`` 1, ``{"a": [1]}`` 2; for a regex or grammar,
the deepest nesting of parentheses.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from grammarserve.errors import GrammarSyntaxError, SchemaValidationError
from grammarserve.fsm.schema.tree import json_path

#: A JSON string (escapes included), removed before brackets are counted.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_OPEN = np.frombuffer(b"[{", dtype=np.uint8)
_CLOSE = np.frombuffer(b"]}", dtype=np.uint8)

Path = tuple[str | int, ...]


def value_depth(value: Any, limit: int) -> tuple[int, Path | None]:
    """The nesting depth of ``value`` (dicts and lists), up to ``limit + 1``, and the path of a
    container nested deeper than ``limit`` (None if there is none). Stops at the first such
    container, so a value nested a million levels deep costs ``limit`` steps along it."""
    deepest = 0
    stack: list[tuple[Any, int, Path]] = [(value, 0, ())]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, dict):
            items: Any = node.items()
        elif isinstance(node, list):
            items = enumerate(node)
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if depth > limit:
            return deepest, path
        stack.extend((v, depth, path + (k,)) for k, v in items if isinstance(v, (dict, list)))
    return deepest, None


def text_depth(text: str | bytes) -> int:
    """The bracket nesting depth of JSON text (brackets inside strings do not count; text
    that is not JSON gets a number all the same, which is fine: the parser refuses it)."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if not raw:
        return 0
    stripped = np.frombuffer(_JSON_STRING.sub(b"", raw), dtype=np.uint8)
    step = np.isin(stripped, _OPEN).astype(np.int32) - np.isin(stripped, _CLOSE)
    return int(np.cumsum(step).max(initial=0))


def paren_depth(text: str, *, quotes: str = "") -> int:
    """The deepest nesting of ``(``...``)`` in a regex or grammar text. Escaped characters and
    character classes (``[...]``) do not count, nor text inside ``quotes`` (e.g. ``"`` for
    the string literals of a Lark grammar)."""
    depth = deepest = 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i = _class_end(text, i + 1)
            continue
        if c in quotes:
            i = _quote_end(text, i + 1, c)
            continue
        if c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth = max(0, depth - 1)
        i += 1
    return deepest


def _class_end(text: str, i: int) -> int:
    """The index after the ``]`` closing a character class opened before ``i``."""
    n = len(text)
    if i < n and text[i] == "^":
        i += 1
    if i < n and text[i] == "]":  # a leading ']' is a literal
        i += 1
    while i < n and text[i] != "]":
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _quote_end(text: str, i: int, quote: str) -> int:
    n = len(text)
    while i < n and text[i] != quote:
        i += 2 if text[i] == "\\" else 1
    return i + 1


def check_schema_depth(schema: Any, limit: int) -> None:
    """Refuse a schema (a dict, or its JSON text) nested deeper than ``limit`` JSON levels, or
    holding a ``pattern`` (or ``patternProperties`` key) with parentheses nested deeper; the
    error names the JSON path and the limit."""
    if isinstance(schema, (str, bytes)):
        depth = text_depth(schema)
        if depth > limit:
            raise SchemaValidationError(_too_deep("the schema", depth, limit, "$"), path="$")
        return
    depth, path = value_depth(schema, limit)
    if path is not None:
        where = json_path(path)
        raise SchemaValidationError(_too_deep("the schema", depth, limit, where, more=True),
                                    path=where)
    for pattern, where in _patterns(schema):
        depth = paren_depth(pattern)
        if depth > limit:
            raise SchemaValidationError(_too_deep("the regex", depth, limit, where), path=where)


def check_text_depth(text: str, limit: int, *, what: str, path: str, quotes: str = "") -> None:
    """Refuse a regex or grammar whose parentheses nest deeper than ``limit``."""
    depth = paren_depth(text, quotes=quotes)
    if depth > limit:
        raise GrammarSyntaxError(_too_deep(what, depth, limit, path), path=path)


def _too_deep(what: str, depth: int, limit: int, where: str, *, more: bool = False) -> str:
    deep = f"more than {limit}" if more else str(depth)
    return (f"{what} is nested {deep} levels deep (at {where}); this server accepts at most "
            f"{limit} levels (the grammar max_depth limit)")


def _patterns(schema: Any) -> list[tuple[str, str]]:
    """Every ``pattern`` value and ``patternProperties`` key in ``schema`` (any dict), with its
    JSON path."""
    out: list[tuple[str, str]] = []
    stack: list[tuple[Any, Path]] = [(schema, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                out.append((node["pattern"], json_path(path + ("pattern",))))
            props = node.get("patternProperties")
            if isinstance(props, dict):
                out += [(k, json_path(path + ("patternProperties", k))) for k in props]
            stack.extend((v, path + (k,)) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, path + (i,)) for i, v in enumerate(node))
    return out
