"""Semantics-preserving rewrites applied after validation, so backends see the simplest
equivalent schema:

- count keywords written as integral floats (``"maxItems": 2.0``) become integers;
- a ``format`` no backend knows is dropped: in Draft 2020-12 ``format`` is an annotation, so
  this keeps the meaning (``strict=True`` refuses unknown formats instead);
- ``oneOf`` whose branches are provably disjoint (different types, or different ``const`` /
  ``enum`` values of a property all branches require — pydantic's discriminated unions, also
  when the branches are local ``$ref``s) becomes ``anyOf``, which is then equivalent. Other
  ``oneOf``s are left for the backend to refuse.
"""

from __future__ import annotations

from typing import Any

from grammarserve.fsm.json_schema import iter_subschemas, resolve_pointer

_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
           "minContains", "maxContains")
#: Formats the backends enforce (llguidance's list; xgrammar supports a superset).
KNOWN_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4",
                           "ipv6", "uri", "uuid"})
_ALL_TYPES = frozenset({"null", "boolean", "object", "array", "number", "string"})


def normalize(schema: dict[str, Any]) -> dict[str, Any]:
    """Rewrite ``schema`` in place (it is a private copy) and return it."""
    for sub, _ in list(iter_subschemas(schema)):
        for key in _COUNTS:
            value = sub.get(key)
            if isinstance(value, float) and value.is_integer():
                sub[key] = int(value)
        if "format" in sub and sub["format"] not in KNOWN_FORMATS:
            del sub["format"]
        branches = sub.get("oneOf")
        if (isinstance(branches, list) and "anyOf" not in sub
                and _pairwise_disjoint([_deref(schema, b) for b in branches])):
            sub["anyOf"] = sub.pop("oneOf")
    return schema


def _deref(root: dict[str, Any], branch: Any) -> Any:
    """``branch``, or the subschema it names if it is only a local ``$ref`` (+ annotations)."""
    for _ in range(8):  # a chain of references, bounded
        if not (isinstance(branch, dict) and isinstance(branch.get("$ref"), str)
                and branch["$ref"].startswith("#")
                and set(branch) <= {"$ref", "title", "description"}):
            return branch
        try:
            branch = resolve_pointer(root, branch["$ref"])
        except (KeyError, ValueError, IndexError):
            return branch
    return branch


def _pairwise_disjoint(branches: list[Any]) -> bool:
    if not all(isinstance(b, dict) for b in branches):
        return False
    return all(_disjoint(a, b) for i, a in enumerate(branches) for b in branches[i + 1:])


def _types(branch: dict[str, Any]) -> frozenset[str]:
    t = branch.get("type")
    if isinstance(t, str):
        t = [t]
    if not isinstance(t, list) or "$ref" in branch or any(
            k in branch for k in ("anyOf", "oneOf", "allOf")):
        if "const" in branch or "enum" in branch:
            values = [branch["const"]] if "const" in branch else branch["enum"]
            return frozenset(_json_type(v) for v in values)
        return _ALL_TYPES
    out = set(t)
    if "number" in out:
        out.add("integer")
    return frozenset(out)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _values(branch: dict[str, Any], prop: str) -> list[Any] | None:
    sub = (branch.get("properties") or {}).get(prop)
    if not isinstance(sub, dict) or prop not in (branch.get("required") or []):
        return None
    if "const" in sub:
        return [sub["const"]]
    if isinstance(sub.get("enum"), list):
        return list(sub["enum"])
    return None


def _disjoint(a: dict[str, Any], b: dict[str, Any]) -> bool:
    ta, tb = _types(a), _types(b)
    ta = ta | ({"number"} if "integer" in ta else set())
    tb = tb | ({"number"} if "integer" in tb else set())
    if not ta & tb:
        return True
    if "$ref" in a or "$ref" in b:
        return False
    for prop in (a.get("properties") or {}):
        va, vb = _values(a, prop), _values(b, prop)
        if va is not None and vb is not None and not any(x == y and type(x) is type(y)
                                                         for x in va for y in vb):
            return ta <= {"object"} and tb <= {"object"}
    return False
