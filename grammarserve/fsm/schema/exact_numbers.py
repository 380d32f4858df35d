"""Numbers the grammar backends represent exactly, and the front end's rewrite that keeps every
numeric keyword inside that range (issue 33).

Measured on llguidance 1.9.1 and xgrammar 0.2.9, each schema compiled in a child process (so a
crash costs only the child), the bound values and their neighbours walked token by token and
compared with ``jsonschema``:

- llguidance reads every numeric keyword as an f64, and integer bounds then as an i64. So an
  integer bound beyond +-2**53 is rounded (``maximum: 2**53 + 1`` took 2**53 + 1 out; rounding
  may as well widen), beyond i64 it is clamped (``minimum: 2**64`` let 2**63 - 1 through, issue
  33 item 2), and integer ranges near -2**63 (``minimum: -2**63`` or ``-2**63 + 1``, and an
  ``enum`` holding -2**63) kill the process with SIGSEGV (item 1). ``const``/``enum`` integers
  are written as their f64's shortest digits (``2**64`` -> ``18446744073709552000``; ``10**22``
  and ``-10**19`` come out right). Number bounds of
  magnitude 1e20 and over are refused ("Failed to generate regex for float range"; 1e15
  compiles), and so is a ``multipleOf`` of more than 15 significant digits (``2**53 + 1``,
  ``1e-15``, ``1e308``), cleanly but without the keyword's path.
- xgrammar keeps integer bounds exact within int64 and refuses others cleanly ("Integer exceeds
  maximum limit"), as it refuses fractional integer bounds (``minimum: 1.5``); it does not
  enforce ``multipleOf`` at all (``backends/xgrammar_subset.py`` refuses it).

:data:`EXACT_NUMBERS` is the table of those ranges, and :func:`exact_numbers` rewrites a
prepared schema so that no backend that may compile it sees a value outside its range:

- an integer-only subschema's fractional bounds become the integers they allow
  (``minimum: 1.5`` -> ``2``, ``exclusiveMaximum: 3.0`` -> ``maximum: 2``): exact;
- a bound outside the range that does not cut the range (``minimum: -2**63`` of a Java
  ``long``) is narrowed to the range's end (``-(2**53)``), as ``schema/close.py`` bounds an unbounded
  integer: every generated value is valid. Only where schemas are closed (the default; with
  ``open_schemas`` nothing is narrowed) and where narrowing a subschema narrows the whole (not
  under ``not``, ``if``, ``oneOf`` or ``contains``);
- any other bound, ``multipleOf`` or ``const``/``enum`` number outside the range is refused,
  naming the keyword and its JSON path (a range wholly beyond +-2**53, such as the issue's
  ``2**64 <= n <= 2**64 + 1``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeGuard

from grammarserve.errors import UnsupportedSchemaError
from grammarserve.fsm.schema.tree import POSITIONS_2020, Shape, iter_subschemas, json_path


@dataclass(frozen=True)
class ExactNumbers:
    """The numbers one backend represents exactly.

    Attributes
    ----------
    max_integer : int
        Integer-only subschemas: bounds, and integers in ``const``/``enum``, of at most this
        magnitude are exact.
    max_bound : float
        Other subschemas (``number``, untyped): bounds of at most this magnitude are exact.
    multiple_digits : int
        ``multipleOf`` values of at most this many significant digits are exact (0: the
        backend's subset refuses ``multipleOf`` itself).
    """

    max_integer: int
    max_bound: float
    min_bound: float
    multiple_digits: int
    unit_exclusive: bool = True


#: What each backend represents exactly (measured: the module docstring). xgrammar's number
#: bounds were not measured past llguidance's: the same range is assumed.
EXACT_NUMBERS: dict[str, ExactNumbers] = {
    "llguidance": ExactNumbers(max_integer=2**53 - 1, max_bound=1e15, min_bound=1e-30,
                               multiple_digits=15, unit_exclusive=False),
    "xgrammar": ExactNumbers(max_integer=2**63 - 1, max_bound=1e15, min_bound=1e-30,
                             multiple_digits=0),
}
#: The backends each ``backend`` setting may hand a JSON schema to.
_REACHES = {"auto": ("llguidance", "xgrammar"), "llguidance": ("llguidance",),
            "xgrammar": ("xgrammar",)}

_LOWER = ("minimum", "exclusiveMinimum")
_UPPER = ("maximum", "exclusiveMaximum")
#: Positions where narrowing a subschema can widen the whole (or change which branch holds).
_NOT_MONOTONE = frozenset({"not", "if", "oneOf", "contains"})


def exact_range(backend: str) -> ExactNumbers:
    """The numbers every backend that ``backend`` (a ``GrammarConfig.backend``) may compile
    with represents exactly: the intersection of their :data:`EXACT_NUMBERS` rows."""
    rows = [EXACT_NUMBERS[name] for name in _REACHES.get(backend, tuple(EXACT_NUMBERS))]
    digits = [r.multiple_digits for r in rows if r.multiple_digits]
    return ExactNumbers(max_integer=min(r.max_integer for r in rows),
                        max_bound=min(r.max_bound for r in rows),
                        min_bound=max(r.min_bound for r in rows),
                        multiple_digits=min(digits) if digits else 0,
                        unit_exclusive=all(r.unit_exclusive for r in rows))


def exact_numbers(schema: dict[str, Any], exact: ExactNumbers, *, narrow: bool
                  ) -> dict[str, Any]:
    """Rewrite ``schema`` (a private copy, in place) as the module docstring says and return
    it; raises :class:`UnsupportedSchemaError` naming the first value it cannot keep exact."""
    for sub, parts in iter_subschemas(schema):
        types = sub.get("type")
        types = {types} if isinstance(types, str) else set(types) if isinstance(types, list) \
            else set()
        integer = "integer" in types and "number" not in types
        if integer:
            _integral_bounds(sub)
        limit = exact.max_integer if integer else exact.max_bound
        may_narrow = narrow and _monotone(parts)
        beyond = [k for k in _LOWER + _UPPER if _is_number(sub.get(k)) and abs(sub[k]) > limit]
        # NOTE: a bound that cuts the exact range is refused first, narrowing or not
        for key in sorted(beyond, key=lambda k: _cuts_nothing(k, sub[k])):
            _narrow_or_refuse(sub, parts, key, limit, may_narrow)
        for key in _LOWER + _UPPER:
            value = sub.get(key)
            if _is_number(value) and value and abs(value) < exact.min_bound:
                where = json_path(parts + (key,))
                raise UnsupportedSchemaError(
                    f"'{key}' {_show(value)} at {where} is too close to 0 for the grammar backends to "
                    f"enforce exactly (a bound other than 0 needs a magnitude of at least "
                    f"{exact.min_bound:g})", path=where, keyword=key)
        multiple = sub.get("multipleOf")
        if exact.multiple_digits and _is_number(multiple) \
                and _digits(multiple) > exact.multiple_digits:
            where = json_path(parts + ("multipleOf",))
            raise UnsupportedSchemaError(
                f"'multipleOf' {_show(multiple)} at {where} has {_digits(multiple)} digits "
                f"(integer part and fraction); the grammar backends enforce at most {exact.multiple_digits}",
                path=where, keyword="multipleOf")
        for key in ("const", "enum"):
            if key in sub:
                big = _first_big_integer([sub[key]] if key == "const" else sub[key],
                                         exact.max_integer)
                if big is not None:
                    where = json_path(parts + (key,))
                    raise UnsupportedSchemaError(
                        f"'{key}' at {where} holds the integer {_show(big)}, beyond what the grammar "
                        f"backends write exactly (magnitude at most {exact.max_integer})",
                        path=where, keyword=key)
    return schema


def _is_number(value: Any) -> TypeGuard[float]:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def unit_exclusive_range(source: Any) -> str | None:
    """For backends without ``unit_exclusive``: where ``source`` (any JSON, a schema or a
    tool list) has a number range with an exclusive bound at an integer ``k`` and its other
    bound within one unit of it (``exclusiveMinimum: 0, maximum: 0.5``), which llguidance
    compiles to a language that takes ``k`` itself (``0``; ``-0`` for ``exclusiveMaximum:
    0``); None if nowhere. (No recursion: a schema may nest as deep as its limit allows.)"""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(source, ())]
    while stack:
        node, parts = stack.pop()
        if isinstance(node, list):
            stack.extend((v, parts + (i,)) for i, v in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        stack.extend((v, parts + (k,)) for k, v in node.items() if isinstance(v, (dict, list)))
        for key, others, step in (("exclusiveMinimum", _UPPER, 1), ("exclusiveMaximum", _LOWER,
                                                                    -1)):
            k = node.get(key)
            if not _is_number(k) or not (isinstance(k, int) or k.is_integer()):
                continue
            if any(_is_number(node.get(o)) and 0 < (node[o] - k) * step < 1 for o in others):
                return json_path(parts + (key,))
    return None


def unit_exclusive_range_text(text: str) -> str | None:
    """:func:`unit_exclusive_range` of the JSON ``text``, without parsing it where it cannot
    hold an exclusive bound: no ``exclusiveM`` in it and no ``\\u`` escape (a key can spell
    its letters only as themselves or as such escapes)."""
    if "exclusiveM" not in text and "\\u" not in text:
        return None
    return unit_exclusive_range(json.loads(text))


def _integral_bounds(sub: dict[str, Any]) -> None:
    """An integer-only subschema's float and exclusive bounds -> the inclusive integer bounds
    they mean (exact: only integers are tested against them; llguidance computes
    ``exclusiveMaximum: -2**53`` as an f64 and took -2**53 itself)."""
    for key in _LOWER + _UPPER:
        value = sub.get(key)
        if not _is_number(value) or (isinstance(value, int) and not key.startswith("excl")):
            continue
        exact = Decimal(value)  # NOTE: the f64's own value, every digit of it
        lower = key in _LOWER
        if key == "minimum":
            new, name = math.ceil(exact), "minimum"
        elif key == "maximum":
            new, name = math.floor(exact), "maximum"
        elif lower:
            new, name = math.floor(exact) + 1, "minimum"
        else:
            new, name = math.ceil(exact) - 1, "maximum"
        del sub[key]
        old = sub.get(name)
        if old is None or (new > old if lower else new < old):
            sub[name] = new


def _cuts_nothing(key: str, value: float) -> bool:
    """A lower bound below the exact range (an upper one above it) cuts nothing inside it."""
    return value < 0 if key in _LOWER else value > 0


def _narrow_or_refuse(sub: dict[str, Any], parts: tuple[str | int, ...], key: str,
                      limit: float, may_narrow: bool) -> None:
    value = sub[key]
    lower = key in _LOWER
    outside = _cuts_nothing(key, value)
    if may_narrow and outside:
        del sub[key]
        name = "minimum" if lower else "maximum"
        end = -int(limit) if lower else int(limit)
        old = sub.get(name)
        if old is None or (end > old if lower else end < old):
            sub[name] = end
        return
    where = json_path(parts + (key,))
    why = ("no value the backends bound exactly satisfies it" if not outside else
           "it is not narrowed to that range where schemas are open or under 'not', 'if', "
           "'oneOf' or 'contains'")
    raise UnsupportedSchemaError(
        f"'{key}' {_show(value)} at {where} is beyond what the grammar backends enforce exactly "
        f"(bounds of magnitude at most {int(limit)}), and {why}", path=where, keyword=key)


def _show(value: float) -> str:
    """A number for a message (a 400-digit bound is not repeated in full)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def _monotone(parts: tuple[str | int, ...]) -> bool:
    """True if narrowing the subschema at ``parts`` narrows the whole schema."""
    expect_keyword = True
    for part in parts:
        if expect_keyword:
            if part in _NOT_MONOTONE:
                return False
            # NOTE: after a map or a list of subschemas comes a name or an index
            expect_keyword = POSITIONS_2020.get(str(part), Shape.ONE) is Shape.ONE
        else:
            expect_keyword = True
    return True


def _digits(value: float) -> int:
    """Positional decimal digits of a JSON number (an f64 as its shortest repr): those of its
    integer part, then of its fraction (``1e15`` -> 16, ``1e-16`` -> 16, ``0.25`` -> 2)."""
    d = Decimal(repr(value) if isinstance(value, float) else value).normalize()
    _, digits, exp = d.as_tuple()
    assert isinstance(exp, int)  # finite: _is_number
    return len(digits) + exp if exp >= 0 else max(len(digits) + exp, 0) - exp


def _written_exactly(v: int) -> bool:
    try:
        return int(Decimal(repr(float(v)))) == v
    except OverflowError:
        return False


def _first_big_integer(values: Iterable[Any], limit: int) -> int | None:
    """The first integer of magnitude over ``limit`` in ``values`` (nested arrays and objects
    included; no recursion: a const may nest as deep as the depth limit allows)."""
    stack = list(values)
    while stack:
        v = stack.pop()
        if isinstance(v, bool):
            continue
        # NOTE: past the range an integer is written as its f64's shortest digits, zeros
        # after (2**64 -> 18446744073709552000): exact only where those digits are the number
        # (10**22), and -2**63, which is not, crashed llguidance
        if isinstance(v, float) and math.isfinite(v) and v.is_integer():
            v = int(v)
        if isinstance(v, int) and abs(v) > limit and not _written_exactly(v):
            return v
        if isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
    return None
