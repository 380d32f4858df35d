"""``oneOf`` -> ``anyOf`` when the branches are provably pairwise disjoint (then no value can
match two branches, and "exactly one" is "at least one").

Two branches are disjoint when, for every JSON type both allow, no value of that type
satisfies both:

- their ``const``/``enum`` values differ, or every listed value of one fails the other;
- objects: a property both require has disjoint subschemas (pydantic's discriminated unions,
  also nested), or a key one requires the other forbids (``properties: {k: false}``, or
  ``additionalProperties: false`` without ``k``);
- numbers: their ranges (``minimum``/``maximum``, exclusive or not) do not meet;
- strings and arrays: their length or item-count ranges do not meet.

Branches that are only a local ``$ref`` (plus annotations) are compared by their targets.
"""

from __future__ import annotations

from typing import Any

import jsonschema

from grammarserve.fsm.schema.algebra.typed_union import DOMAINS, domains_of, same_value
from grammarserve.fsm.schema.tree import iter_subschemas, resolve_pointer

_SCALAR_KEYS = frozenset({"title", "description", "$comment", "default", "examples"})
_DEPTH = 4


def rewrite_oneof(schema: dict[str, Any]) -> dict[str, Any]:
    """Turn every provably disjoint ``oneOf`` of ``schema`` into ``anyOf`` (in place)."""
    for sub, _ in list(iter_subschemas(schema)):
        branches = sub.get("oneOf")
        if isinstance(branches, list) and "anyOf" not in sub \
                and pairwise_disjoint(schema, branches):
            sub["anyOf"] = sub.pop("oneOf")
    return schema


def pairwise_disjoint(root: dict[str, Any], branches: list[Any]) -> bool:
    """True if no value satisfies two of ``branches`` (``False`` when unsure)."""
    resolved = [deref(root, b) for b in branches]
    return all(disjoint(root, a, b) for i, a in enumerate(resolved) for b in resolved[i + 1:])


def deref(root: dict[str, Any], branch: Any) -> Any:
    """``branch``, or the subschema it names if it is only a local ``$ref`` (+ annotations)."""
    for _ in range(8):  # a chain of references, bounded
        if not (isinstance(branch, dict) and isinstance(branch.get("$ref"), str)
                and branch["$ref"].startswith("#")
                and set(branch) <= {"$ref"} | _SCALAR_KEYS):
            return branch
        try:
            branch = resolve_pointer(root, branch["$ref"])
        except (KeyError, ValueError, IndexError):
            return branch
    return branch


def disjoint(root: dict[str, Any], a: Any, b: Any, depth: int = 0) -> bool:
    """True if no value satisfies both ``a`` and ``b``."""
    a, b = deref(root, a), deref(root, b)
    if a is False or b is False:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict) or depth > _DEPTH:
        return False
    common = [d for d in _domains(a) if d in _domains(b)]
    return all(_disjoint_in(root, a, b, d, depth) for d in common)


def _domains(branch: dict[str, Any]) -> tuple[str, ...]:
    values = _finite(branch)
    if values is not None:
        found = {_domain(v) for v in values}
        if "type" in branch:  # ``{"type": "string", "enum": ["a", []]}`` holds strings only
            found &= set(domains_of(branch["type"]))
        return tuple(d for d in DOMAINS if d in found)
    if "$ref" in branch or any(k in branch for k in ("anyOf", "oneOf", "allOf")):
        return DOMAINS
    return domains_of(branch.get("type"))


def _domain(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or isinstance(value, float) and value.is_integer():
        return "integer"
    if isinstance(value, float):
        return "fraction"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _finite(branch: dict[str, Any]) -> list[Any] | None:
    if "const" in branch:
        return [branch["const"]]
    enum = branch.get("enum")
    return list(enum) if isinstance(enum, list) else None


def _disjoint_in(root: dict[str, Any], a: dict[str, Any], b: dict[str, Any], d: str,
                 depth: int) -> bool:
    va, vb = _finite(a), _finite(b)
    if va is not None and vb is not None:
        return not any(same_value(x, y) for x in va for y in vb if _domain(x) == d)
    for values, other in ((va, b), (vb, a)):
        if values is not None and _all_fail(root, [v for v in values if _domain(v) == d],
                                            other):
            return True
    if d == "object":
        return _objects_disjoint(root, a, b, depth)
    if d in ("integer", "fraction"):
        return _ranges_disjoint(_range(a, "minimum", "maximum"), _range(b, "minimum", "maximum"))
    if d == "string":
        return _ranges_disjoint(_range(a, "minLength", "maxLength"),
                                _range(b, "minLength", "maxLength"))
    if d == "array":
        return _ranges_disjoint(_range(a, "minItems", "maxItems"),
                                _range(b, "minItems", "maxItems"))
    return False


def _all_fail(root: dict[str, Any], values: list[Any], schema: dict[str, Any]) -> bool:
    if not values or any("$ref" in sub or "$dynamicRef" in sub
                         for sub, _ in iter_subschemas(schema)):
        return False
    check = jsonschema.Draft202012Validator(schema)
    return not any(check.is_valid(v) for v in values)


def _objects_disjoint(root: dict[str, Any], a: dict[str, Any], b: dict[str, Any],
                      depth: int) -> bool:
    ra, rb = _required(a), _required(b)
    pa, pb = _props(a), _props(b)
    for key in ra & rb:
        if key in pa and key in pb and disjoint(root, pa[key], pb[key], depth + 1):
            return True
    return any(_forbids(other, key) for keys, other in ((ra, b), (rb, a)) for key in keys)


def _required(s: dict[str, Any]) -> set[str]:
    r = s.get("required")
    return {k for k in r if isinstance(k, str)} if isinstance(r, list) else set()


def _props(s: dict[str, Any]) -> dict[str, Any]:
    p = s.get("properties")
    return p if isinstance(p, dict) else {}


def _forbids(s: dict[str, Any], key: str) -> bool:
    props = _props(s)
    if key in props:
        return props[key] is False
    return s.get("additionalProperties") is False and not s.get("patternProperties")


Range = tuple[float, bool, float, bool]  # (low, low open, high, high open)


def _range(s: dict[str, Any], lo_key: str, hi_key: str) -> Range:
    lo, lo_open, hi, hi_open = float("-inf"), False, float("inf"), False
    if isinstance(s.get(lo_key), (int, float)):
        lo = s[lo_key]
    if isinstance(s.get(hi_key), (int, float)):
        hi = s[hi_key]
    if lo_key == "minimum":
        ex = s.get("exclusiveMinimum")
        if isinstance(ex, (int, float)) and not isinstance(ex, bool) and ex >= lo:
            lo, lo_open = ex, True
        ex = s.get("exclusiveMaximum")
        if isinstance(ex, (int, float)) and not isinstance(ex, bool) and ex <= hi:
            hi, hi_open = ex, True
    return lo, lo_open, hi, hi_open


def _ranges_disjoint(a: Range, b: Range) -> bool:
    def before(x: Range, y: Range) -> bool:  # x ends before y starts
        return x[2] < y[0] or (x[2] == y[0] and (x[3] or y[1]))

    return before(a, b) or before(b, a)
