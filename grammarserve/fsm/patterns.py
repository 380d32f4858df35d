"""Which strings the front end takes as a ``pattern`` (the meta-schema's ``format: regex``).

Python's ``re`` decides, as ``jsonschema``'s format checker does, with one extension: Unicode
property escapes (``\\p{Letter}``, ``\\P{L}``, ECMA-262 ``u`` mode, which JSON Schema patterns
use), which ``re`` rejects. Those are read the same way by llguidance (Rust ``regex``) and by
the value checks (``jsonschema_rs``); xgrammar refuses them, and ``schema/algebra/regex_complement.py`` does
not negate them. A pattern is accepted with them when the ``regex`` module compiles it and ``re``
compiles it with each escape replaced by a plain class.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any

import jsonschema

_PROPERTY = re.compile(r"\\[pP](?:\{[A-Za-z0-9_=]+\}|[A-Za-z])")


def is_pattern(value: Any) -> bool:
    """Whether ``value`` is a pattern the front end takes (non-strings pass, as in
    ``jsonschema``: the meta-schema's ``type`` decides those)."""
    if not isinstance(value, str):
        return True
    try:
        re.compile(value)
        return True
    except re.error:
        pass
    if not _PROPERTY.search(value):
        return False
    try:
        import regex

        regex.compile(value)
        re.compile(_PROPERTY.sub("a", value))
    except Exception:  # noqa: BLE001 - regex.error, re.error: not a pattern
        return False
    return True


@functools.lru_cache(maxsize=1)
def format_checker() -> jsonschema.FormatChecker:
    """Draft 2020-12's format checker with ``regex`` decided by :func:`is_pattern`."""
    checker = jsonschema.FormatChecker()
    checker.checkers = dict(jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers)
    checker.checkers["regex"] = (is_pattern, ())
    return checker


def regex_chars(pattern: str) -> Iterator[tuple[int, str, bool]]:
    """The unescaped characters of a regex: ``(position, character, inside a class)``. An
    escape (``\\`` and the character after it) yields nothing; a class's opening ``[`` is
    outside it, its ``^``, a leading ``]`` and its closing ``]`` inside."""
    i, in_class, n = 0, False, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        yield i, c, in_class
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            for member in "^]":  # NOTE: literal where they open the class
                if pattern[i + 1:i + 2] == member:
                    i += 1
                    yield i, member, True
        i += 1
