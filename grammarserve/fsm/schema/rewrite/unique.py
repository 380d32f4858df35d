"""``uniqueItems: true`` over finite item domains -> the ``enum`` of every array it allows.

When each position of the array can hold only finitely many values (``const``, ``enum``,
``boolean``, ``null``; per ``prefixItems`` position and for ``items``), the arrays of
distinct items within ``minItems``/``maxItems`` are finitely many: they are enumerated
(duplicates by JSON equality, so ``1`` and ``1.0`` are one value) and added as an ``enum``
for arrays, which every backend enforces exactly. More than :data:`MAX_ARRAYS` arrays are
refused with a message; open item domains (strings, numbers, objects) are left for the
front end to refuse.
"""

from __future__ import annotations

from typing import Any

import jsonschema

from grammarserve.errors import UnsupportedSchemaError
from grammarserve.fsm.schema.algebra.disjoint import deref
from grammarserve.fsm.schema.algebra.negate import ANNOTATIONS
from grammarserve.fsm.schema.algebra.typed_union import (
    DOMAINS,
    Parts,
    domains_of,
    emit,
    restrict,
    same_value,
)
from grammarserve.fsm.schema.rewrite.negated import Leftover, attach
from grammarserve.fsm.schema.tree import iter_subschemas, json_path
from grammarserve.fsm.value_check import identity

#: At most this many distinct-item arrays are enumerated.
MAX_ARRAYS = 64
_OPEN = frozenset({"contains", "unevaluatedItems", "minContains", "maxContains"})


def rewrite_unique(schema: dict[str, Any], leftover: Leftover | None = None
                   ) -> dict[str, Any]:
    """Apply the rewrite above to every ``uniqueItems`` of ``schema`` (in place); offer those
    without an exact rewrite (open domains, too many arrays) to ``leftover``."""
    for sub, parts in reversed(list(iter_subschemas(schema))):
        if sub.get("uniqueItems") is False:
            del sub["uniqueItems"]
        if sub.get("uniqueItems") is not True or _OPEN & set(sub):
            continue
        arrays = unique_arrays(schema, sub)
        if (arrays is None or len(arrays) > MAX_ARRAYS) and leftover is not None \
                and leftover(parts, "uniqueItems"):
            continue  # left to a run-time check
        if arrays is None:
            continue
        where = json_path(parts + ("uniqueItems",))
        if len(arrays) > MAX_ARRAYS:
            raise UnsupportedSchemaError(
                f"unsupported keyword 'uniqueItems' at {where}: the items allow more than "
                f"{MAX_ARRAYS} arrays of distinct values, too many to enumerate; use an 'enum' "
                "of arrays or drop the constraint", path=where, keyword="uniqueItems")
        del sub["uniqueItems"]
        others: Parts = {d: [{}] for d in DOMAINS if d != "array"}
        allowed = emit(restrict({**others, "array": [{"enum": arrays}]},
                                domains_of(sub.get("type"))))
        if allowed is False:
            raise UnsupportedSchemaError(
                f"'uniqueItems' at {where}: no array of distinct items fits, so nothing can be "
                "generated", path=where, keyword="uniqueItems")
        attach(sub, allowed)
    return schema


def unique_arrays(root: dict[str, Any], sub: dict[str, Any]) -> list[list[Any]] | None:
    """Every array of distinct items ``sub`` allows (up to ``MAX_ARRAYS + 1`` of them), or
    ``None`` if some position has an open domain."""
    prefix: list[Any] = sub["prefixItems"] if isinstance(sub.get("prefixItems"), list) else []
    domains = [finite_values(root, p) for p in prefix]
    rest = finite_values(root, sub.get("items", True))
    if any(d is None for d in domains) or rest is None and "items" in sub:
        return None
    lo = sub.get("minItems", 0)
    hi = sub.get("maxItems")
    if rest is None and (hi is None or hi > len(prefix)):
        return None  # no ``items``: open after the prefix unless maxItems stops there
    if not prefix and rest is not None and _count(len(rest), lo, hi) > MAX_ARRAYS:
        return [[]] * (MAX_ARRAYS + 1)  # too many: not enumerated
    out: list[list[Any]] = []

    def extend(array: list[Any]) -> None:
        if len(out) > MAX_ARRAYS:
            return
        if len(array) >= lo:
            out.append(list(array))
        if hi is not None and len(array) >= hi:
            return
        i = len(array)
        values = domains[i] if i < len(prefix) else rest
        for v in values or []:
            if len(out) > MAX_ARRAYS:
                return
            if not any(same_value(v, w) for w in array):
                array.append(v)
                extend(array)
                array.pop()

    extend([])
    return out


def finite_values(root: dict[str, Any], schema: Any) -> list[Any] | None:
    """The values ``schema`` allows if they are finitely many (distinct), else ``None``."""
    schema = deref(root, schema)
    if schema is False:
        return []
    if not isinstance(schema, dict):
        return None
    rest = {k: v for k, v in schema.items() if k not in ANNOTATIONS}
    if "const" in rest or isinstance(rest.get("enum"), list):
        values = [rest["const"]] if "const" in rest else list(rest["enum"])
        others = {k: v for k, v in rest.items() if k not in ("const", "enum")}
        if any("$ref" in s or "$dynamicRef" in s for s, _ in iter_subschemas(others)):
            return None
        if others:
            check = jsonschema.Draft202012Validator(others)
            values = [v for v in values if check.is_valid(v)]
    elif set(rest) <= {"type"} and "type" in rest \
            and set(domains_of(rest["type"])) <= {"null", "boolean"}:
        kinds = domains_of(rest["type"])
        values = ([None] if "null" in kinds else []) + ([False, True] if "boolean" in kinds
                                                        else [])
    else:
        return None
    distinct: dict[str, Any] = {}
    for v in values:
        distinct.setdefault(identity(v), v)
    return list(distinct.values())


def _count(n: int, lo: int, hi: int | None) -> int:
    """How many arrays of distinct items from ``n`` values have ``lo`` to ``hi`` items."""
    total, arrangements = 0, 1
    for k in range(n + 1 if hi is None else min(n, hi) + 1):
        if k:
            arrangements *= n - k + 1
        if k >= lo:
            total += arrangements
        if total > MAX_ARRAYS:
            break
    return total
