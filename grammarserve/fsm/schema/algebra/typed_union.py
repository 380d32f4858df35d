"""A schema as a union of per-type alternatives: the algebra behind exact negation.

Every JSON value has one of seven *domains*: ``null``, ``boolean``, ``integer``, ``fraction``
(a number that is not an integer), ``string``, ``array``, ``object``. A :data:`Parts` maps a
domain to its alternatives: keyword dicts that constrain only values of that domain (``{}``:
every value of the domain); a missing domain has no value. Unions and intersections are
computed domain by domain, and :func:`emit` writes the result back as a plain schema
(``anyOf`` of typed branches). Anything that cannot be written exactly raises
:class:`Unexpressible`, and the caller keeps refusing the schema.
"""

from __future__ import annotations

import json
import math
from typing import Any

DOMAINS = ("null", "boolean", "integer", "fraction", "string", "array", "object")
TYPE_DOMAINS: dict[str, tuple[str, ...]] = {
    "null": ("null",), "boolean": ("boolean",), "integer": ("integer",),
    "number": ("integer", "fraction"), "string": ("string",), "array": ("array",),
    "object": ("object",)}
#: At most this many alternatives in one result (a bigger expansion is refused).
MAX_ALTERNATIVES = 64

Alt = dict[str, Any]
Parts = dict[str, list[Alt]]

# Keywords read together: merging one side's member into the other's changes what it sees.
_GROUPS = (frozenset({"properties", "patternProperties", "additionalProperties",
                      "unevaluatedProperties"}),
           frozenset({"items", "prefixItems", "unevaluatedItems"}),
           frozenset({"contains", "minContains", "maxContains"}))
_LOWER = ("minLength", "minItems", "minProperties", "minimum", "exclusiveMinimum")
_UPPER = ("maxLength", "maxItems", "maxProperties", "maximum", "exclusiveMaximum")


class Unexpressible(Exception):
    """The schema cannot be rewritten exactly; ``keyword`` names what stops it."""

    def __init__(self, keyword: str, reason: str) -> None:
        super().__init__(f"'{keyword}': {reason}")
        self.keyword = keyword
        self.reason = reason


def everything(domains: tuple[str, ...] = DOMAINS) -> Parts:
    """Every value of ``domains``."""
    return {d: [{}] for d in domains}


def domains_of(type_value: Any) -> tuple[str, ...]:
    """The domains a ``type`` keyword allows (all for a missing or odd one)."""
    names = [type_value] if isinstance(type_value, str) else type_value
    if not isinstance(names, list):
        return DOMAINS
    out = {d for n in names if isinstance(n, str) for d in TYPE_DOMAINS.get(n, ())}
    return tuple(d for d in DOMAINS if d in out)


def _key(alt: Alt) -> str:
    return json.dumps(alt, sort_keys=True)


def _dedupe(alts: list[Alt]) -> list[Alt]:
    if any(a == {} for a in alts):
        return [{}]
    seen: dict[str, Alt] = {}
    for a in alts:
        seen.setdefault(_key(a), a)
    return list(seen.values())


def union(*parts: Parts) -> Parts:
    """Values in any of ``parts``."""
    out: Parts = {}
    for p in parts:
        for d, alts in p.items():
            out[d] = _dedupe(out.get(d, []) + alts)
    _check_size(out)
    return out


def intersect(*parts: Parts) -> Parts:
    """Values in every one of ``parts``."""
    if not parts:
        return everything()
    out = parts[0]
    for p in parts[1:]:
        nxt: Parts = {}
        for d in DOMAINS:
            if d in out and d in p:
                alts = [m for a in out[d] for b in p[d] if (m := merge(a, b)) is not None]
                if alts:
                    nxt[d] = _dedupe(alts)
        _check_size(nxt)
        out = nxt
    return out


def restrict(parts: Parts, domains: tuple[str, ...]) -> Parts:
    """Only the values of ``domains``."""
    return {d: alts for d, alts in parts.items() if d in domains}


def _check_size(parts: Parts) -> None:
    n = sum(len(a) for a in parts.values())
    if n > MAX_ALTERNATIVES:
        raise Unexpressible("not", f"the exact rewrite needs {n} alternatives (more than "
                                   f"{MAX_ALTERNATIVES})")


def same_value(a: Any, b: Any) -> bool:
    """JSON Schema equality of two instances (``1 == 1.0``, ``True != 1``)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def conjoin(a: Any, b: Any) -> Any:
    """``a`` and ``b`` as one schema: ``true``/``false`` absorbed, equal schemas kept once,
    else ``{"allOf": [a, b]}``."""
    if a is True or a == {}:
        return b
    if b is True or b == {}:
        return a
    if a is False or b is False:
        return False
    if a == b:
        return a
    return {"allOf": [a, b]}


def merge(a: Alt, b: Alt) -> Alt | None:
    """One alternative meaning ``a`` and ``b`` (same domain), or ``None`` if they are
    plainly contradictory."""
    if not a:
        return dict(b)
    if not b:
        return dict(a)
    for group in _GROUPS:
        ga, gb = group & set(a), group & set(b)
        if ga and gb and (ga != gb or ga != {"properties"}):
            return {"allOf": [a, b]}
    out = dict(a)
    for key, value in b.items():
        if key not in out:
            out[key] = value
        elif key in _LOWER:
            out[key] = max(out[key], value)
        elif key in _UPPER:
            out[key] = min(out[key], value)
        elif key == "required":
            out[key] = list(dict.fromkeys(list(out[key]) + list(value)))
        elif key == "properties":
            props = dict(out[key])
            for name, sub in value.items():
                props[name] = conjoin(props[name], sub) if name in props else sub
            out[key] = props
        elif key in ("enum", "const"):
            pass  # handled below
        elif out[key] != value:
            return {"allOf": [a, b]}
    return _values(out, a, b)


def _values(out: Alt, a: Alt, b: Alt) -> Alt | None:
    allowed: list[Any] | None = None
    for side in (a, b):
        vals = [side["const"]] if "const" in side else side.get("enum")
        if isinstance(vals, list):
            allowed = vals if allowed is None else [
                v for v in allowed if any(same_value(v, w) for w in vals)]
    if allowed is not None:
        out.pop("const", None)
        out.pop("enum", None)
        if not allowed:
            return None
        out["enum"] = allowed
    for lo, hi in (("minLength", "maxLength"), ("minItems", "maxItems"),
                   ("minProperties", "maxProperties"), ("minimum", "maximum")):
        if lo in out and hi in out and out[lo] > out[hi]:
            return None
    return out


def emit(parts: Parts) -> Any:
    """``parts`` as a schema: ``false``, ``true``, one typed branch or an ``anyOf``."""
    if all(parts.get(d) == [{}] for d in DOMAINS):
        return True
    whole: list[str] = []
    branches: list[dict[str, Any]] = []
    for name, alts in _typed(parts):
        if alts == [{}]:
            whole.append(name)
        else:
            branches.extend({"type": name, **alt} for alt in alts)
    if whole:
        branches.insert(0, {"type": whole[0] if len(whole) == 1 else whole})
    if not branches:
        return False
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def _typed(parts: Parts) -> list[tuple[str, list[Alt]]]:
    out: list[tuple[str, list[Alt]]] = []
    for d in ("null", "boolean"):
        if d in parts:
            out.append((d, parts[d]))
    ints, fracs = parts.get("integer", []), parts.get("fraction", [])
    if fracs:
        # NOTE: "a number that is not an integer" has no keyword: the fractions' alternatives
        # must be among the integers' ones, then ``number`` covers both.
        keys = {_key(a) for a in ints}
        if ints != [{}] and not all(_key(f) in keys for f in fracs) or fracs == [{}] != ints:
            raise Unexpressible("type", "the result would need 'a number that is not an "
                                        "integer', which no keyword expresses")
        out.append(("number", fracs))
        fkeys = {_key(f) for f in fracs}
        rest = [a for a in ints if _key(a) not in fkeys]
        if rest and fracs != [{}]:
            out.append(("integer", rest))
    elif ints:
        out.append(("integer", [a for a in ints if _has_integer(a)]))
    for d in ("string", "array", "object"):
        if d in parts:
            out.append((d, parts[d]))
    return out


def _has_integer(alt: Alt) -> bool:
    """False for an integer range that holds no integer (``1 < n < 2``)."""
    lo, hi = alt.get("exclusiveMinimum"), alt.get("exclusiveMaximum")
    if not isinstance(lo, (int, float)) or not isinstance(hi, (int, float)):
        return True
    return math.floor(lo) + 1 < hi
