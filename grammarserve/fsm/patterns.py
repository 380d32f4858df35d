"""Which strings the front end takes as a ``pattern`` (the meta-schema's ``format: regex``).

Python's ``re`` decides, as ``jsonschema``'s format checker does, with one extension: Unicode
property escapes (``\\p{Letter}``, ``\\P{L}``, ECMA-262 ``u`` mode, which JSON Schema patterns
use), which ``re`` rejects. Those are read the same way by llguidance (Rust ``regex``) and by
the value checks (``jsonschema_rs``); xgrammar refuses them, and ``regex_complement.py`` does
not negate them. A pattern is accepted with them when the ``regex`` module compiles it and ``re``
compiles it with each escape replaced by a plain class.
"""

from __future__ import annotations

import functools
import re
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
