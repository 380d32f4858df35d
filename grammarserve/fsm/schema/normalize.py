"""Semantics-preserving rewrites applied after validation, so backends see the simplest
equivalent schema:

- count keywords written as integral floats (``"maxItems": 2.0``) become integers;
- ``minContains``/``maxContains`` without ``contains`` mean nothing and are dropped, and so
  are keywords Draft 2020-12 does not define (``x-taplo``, ``markdownDescription``; kept
  where a ``$ref`` points into them): a backend may read them as constraints it cannot
  enforce (llguidance refuses a recursive ``$ref`` beside one, xgrammar's subset refuses them);
- a ``format`` no backend knows is dropped: in Draft 2020-12 ``format`` is an annotation, so
  this keeps the meaning (``strict=True`` refuses unknown formats instead);
- a subschema whose ``$ref`` names the schema ``false`` is ``false`` (it accepts nothing,
  whatever its siblings say): llguidance refuses a reference to ``false`` even where the
  value may be absent (``properties: {"k": {"$ref": "#/$defs/never"}}``);
- a ``$ref`` beside other assertions whose target can reach itself through references
  becomes an ``allOf`` member holding a copy of the target (both apply in place, so this is
  the same conjunction), and an ``allOf`` member that is only such a ``$ref`` (beside other
  members or assertions) becomes the copy: llguidance refuses "circular references with
  sibling keys";
- an object in ``const``/``enum`` is offered in every key order (the same JSON value; the
  backends write a constant's keys in the order given), at most :data:`MAX_KEY_ORDERS` orders
  per value, else only as written;
- ``oneOf`` whose branches are provably disjoint becomes ``anyOf``, which is then equivalent
  (``schema/algebra/disjoint.py``: different types, distinct ``const``/``enum`` values, also of a
  property both branches require — pydantic's discriminated unions —, a key one requires and
  the other forbids, numeric or length ranges that do not meet); other ``oneOf``s become the
  ``anyOf`` of their exclusive cases (``schema/rewrite/oneof.py``: branch i and not the others)
  when every branch has an exact negation, else are left for the backend to refuse;
- repeated ``allOf``/``anyOf`` members are dropped (``schema/rewrite/dedupe.py``: llguidance intersects them
  as written).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from grammarserve.fsm.schema.algebra.disjoint import rewrite_oneof
from grammarserve.fsm.schema.rewrite.dedupe import dedupe_members
from grammarserve.fsm.schema.rewrite.oneof import rewrite_oneof_cases
from grammarserve.fsm.schema.tree import (
    copy_json,
    iter_refs,
    iter_subschemas,
    pointer,
    pointer_parts,
    resolve_pointer,
)

_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
           "minContains", "maxContains")
#: Formats the backends enforce (llguidance's list; xgrammar supports a superset).
KNOWN_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4",
                           "ipv6", "uri", "uuid"})


#: The keywords of Draft 2020-12 (and the containers and older keywords the front end reads).
KEYWORDS = frozenset({
    "$schema", "$id", "$ref", "$anchor", "$dynamicRef", "$dynamicAnchor", "$vocabulary",
    "$comment", "$defs", "definitions", "prefixItems", "items", "contains", "additionalProperties",
    "properties", "patternProperties", "dependentSchemas", "propertyNames", "if", "then", "else",
    "allOf", "anyOf", "oneOf", "not", "unevaluatedItems", "unevaluatedProperties", "type",
    "const", "enum", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "maxContains",
    "minContains", "maxProperties", "minProperties", "required", "dependentRequired", "format",
    "contentEncoding", "contentMediaType", "contentSchema", "title", "description", "default",
    "deprecated", "readOnly", "writeOnly", "examples", "dependencies", "additionalItems"})


def normalize(schema: dict[str, Any]) -> dict[str, Any]:
    """Rewrite ``schema`` in place (it is a private copy) and return it."""
    nodes = list(iter_subschemas(schema))
    referenced = _referenced_keys(schema)
    for sub, parts in nodes:
        where = tuple(str(p) for p in parts)
        for key in [k for k in sub if k not in KEYWORDS and (where, k) not in referenced]:
            del sub[key]
        for key in _COUNTS:
            value = sub.get(key)
            if isinstance(value, float) and value.is_integer():
                sub[key] = int(value)
        if "contains" not in sub:
            sub.pop("minContains", None)
            sub.pop("maxContains", None)
        if "format" in sub and sub["format"] not in KNOWN_FORMATS:
            del sub["format"]
        _calendar_pattern(sub)
    _inline_false_refs(schema, nodes)
    copied = _inline_cyclic_refs(schema, nodes)
    for sub, _ in nodes:
        _constants_in_any_key_order(sub)
    # NOTE: the oneOf rewrites walk the schema twice; without a oneOf (the copies made above
    # may hold one) they have nothing to do
    if copied or any("oneOf" in sub for sub, _ in nodes):
        schema = rewrite_oneof_cases(rewrite_oneof(schema))
    return dedupe_members(schema)


#: RFC 3339 full-date on the Gregorian calendar (02-29 only in leap years), and date-time with
#: it ('T'/'Z' in either case, fractional seconds, second 60, numeric offsets). The backends'
#: own formats take 02-29 in every year, and xgrammar's date-time 04-31 too.
_DATE = (r"(\d{4}-(0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|\d{4}-(0[469]|11)-(0[1-9]|[12]\d|30)"
         r"|\d{4}-02-(0[1-9]|1\d|2[0-8])"
         r"|(\d{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29)")
_TIME = r"([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)"
CALENDAR_PATTERNS = {"date": f"^{_DATE}$", "date-time": f"^{_DATE}[Tt]{_TIME}$"}


def _calendar_pattern(sub: dict[str, Any]) -> None:
    """``format: date`` / ``date-time`` as the exact pattern (beside a ``pattern`` of its own,
    in an ``allOf``), so every backend holds the calendar."""
    fmt = sub.get("format")
    if not isinstance(fmt, str) or fmt not in CALENDAR_PATTERNS:
        return
    del sub["format"]
    if "pattern" in sub:
        sub["allOf"] = [*sub.get("allOf", []), {"pattern": CALENDAR_PATTERNS[fmt]}]
    else:
        sub["pattern"] = CALENDAR_PATTERNS[fmt]


def _inline_false_refs(schema: dict[str, Any],
                       nodes: list[tuple[dict[str, Any], tuple[str | int, ...]]]) -> None:
    """Replace each subschema (below the root) whose local ``$ref`` resolves to ``false`` by
    ``false`` (in place)."""

    for sub, parts in nodes:
        ref = sub.get("$ref")
        if not parts or not isinstance(ref, str) or not ref.startswith("#"):
            continue
        try:
            if resolve_pointer(schema, ref) is not False:
                continue
            resolve_pointer(schema, pointer(parts[:-1]))[parts[-1]] = False
        except (KeyError, IndexError, ValueError, TypeError):
            continue


#: At most this many key orders of one ``const``/``enum`` value are offered.
MAX_KEY_ORDERS = 24


def _key_orders(value: Any, limit: int) -> list[Any] | None:
    """Every key order of the objects in ``value`` (JSON; ``value`` itself first), or None
    past ``limit`` variants."""
    if isinstance(value, list):
        out: list[Any] = [[]]
        for item in value:
            inner = _key_orders(item, limit)
            if inner is None or len(out) * len(inner) > limit:
                return None
            out = [head + [v] for head in out for v in inner]
        return out
    if not isinstance(value, dict):
        return [value]
    if math.factorial(len(value)) > limit:
        return None
    variants: list[Any] = []
    for keys in itertools.permutations(value):
        parts: list[list[Any]] = [[]]
        for key in keys:
            inner = _key_orders(value[key], limit)
            if inner is None or len(parts) * len(inner) * (len(variants) + 1) > limit:
                return None
            parts = [head + [(key, v)] for head in parts for v in inner]
        variants.extend(dict(p) for p in parts)
        if len(variants) > limit:
            return None
    return variants


def _constants_in_any_key_order(sub: dict[str, Any]) -> None:
    """``const``/``enum`` objects -> ``enum`` of their key orders (in place)."""
    if "const" in sub and "enum" not in sub and isinstance(sub["const"], (dict, list)):
        variants = _key_orders(sub["const"], MAX_KEY_ORDERS)
        if variants is not None and len(variants) > 1:
            del sub["const"]
            sub["enum"] = variants
            return
    values = sub.get("enum")
    if isinstance(values, list) and any(isinstance(v, (dict, list)) for v in values):
        out: list[Any] = []
        for v in values:
            variants = _key_orders(v, MAX_KEY_ORDERS) if isinstance(v, (dict, list)) else None
            out.extend(variants if variants is not None else [v])
        sub["enum"] = out


#: Keys beside a ``$ref`` that assert nothing.
_INERT = frozenset({"$ref", "$defs", "definitions", "$schema", "$id", "$comment", "title",
                    "description", "default", "examples", "deprecated", "readOnly",
                    "writeOnly"})


def _inline_cyclic_refs(schema: dict[str, Any],
                        nodes: list[tuple[dict[str, Any], tuple[str | int, ...]]]) -> bool:
    """``{..., "$ref": X}`` -> ``{..., "allOf": [..., copy of X]}`` where X reaches itself
    through references and the subschema has other assertions (in place; one level: a copy
    whose own root holds a ``$ref`` is not inlined). Returns whether it copied anything."""
    changed = False

    inside: dict[str, list[str]] = {}  # reference -> the local references in its target

    def refs_in(ref: str) -> list[str]:
        if ref not in inside:
            try:
                target = resolve_pointer(schema, ref)
            except (KeyError, IndexError, ValueError, TypeError):
                target = None
            inside[ref] = [("#" if s["$ref"] == "#/" else s["$ref"])
                           for s, _ in iter_refs(target) if s["$ref"].startswith("#")]
        return inside[ref]

    def reaches_itself(ref: str) -> bool:
        seen: set[str] = set()
        todo = [ref]
        while todo:
            for inner in refs_in(todo.pop()):
                if inner == ref:
                    return True
                if inner not in seen:
                    seen.add(inner)
                    todo.append(inner)
        return False

    def inlined(ref: Any) -> dict[str, Any] | None:
        """A copy of the target of ``ref`` if it is a local reference into a cycle (and the
        target holds no ``$ref`` of its own), else None."""
        if not isinstance(ref, str) or not ref.startswith("#") or not reaches_itself(ref):
            return None
        try:
            target = resolve_pointer(schema, ref)
        except (KeyError, IndexError, ValueError, TypeError):
            return None
        if not isinstance(target, dict) or "$ref" in target:
            return None
        return {k: copy_json(v, depth=10_000) for k, v in target.items()
                if k not in ("$defs", "definitions")}

    for sub, _ in nodes:
        members = sub.get("allOf")
        if isinstance(members, list) and len(members) + len(set(sub) - _INERT) > 2:
            # NOTE: a member that is only a reference into a cycle is intersected with the
            # others: the same refusal
            for i, member in enumerate(members):
                if isinstance(member, dict) and set(member) <= _INERT and "$ref" in member:
                    copied = inlined(member["$ref"])
                    if copied is not None:
                        members[i] = copied
                        changed = True
        if set(sub) <= _INERT:
            continue
        copied = inlined(sub.get("$ref"))
        if copied is not None:
            del sub["$ref"]
            sub["allOf"] = [*sub.get("allOf", []), copied]
            changed = True
    return changed


def _referenced_keys(schema: dict[str, Any]) -> set[tuple[Any, str]]:
    """(subschema path, key) pairs some local ``$ref`` points into."""

    out: set[tuple[Any, str]] = set()
    for sub, _ in iter_refs(schema):
        ref = sub["$ref"]
        if ref.startswith("#"):
            steps = pointer_parts(ref)
            out.update((tuple(steps[:i]), str(steps[i])) for i in range(len(steps)))
    return out

