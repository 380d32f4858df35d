"""Subschemas whose own keywords no value satisfies: ``minItems`` over ``maxItems``, ``type``s
that ``allOf`` members contradict, an empty ``enum``, a ``const`` of the wrong type...

:func:`own_emptiness` looks at one subschema: its types (with those its ``allOf`` members,
``$ref`` target and ``anyOf`` / ``oneOf`` members allow) and, per type, the bounds it sets on
values of that type. With ``const`` / ``enum`` it is exact: the candidate values are validated
against the whole subschema (``jsonschema``, references resolved in the root). What it finds
is the *reason* a subschema is empty, with the keyword and where it is; whether a schema has an
instance at all also depends on its children (``schema/algebra/finite.py``).

It is conservative: a case it does not model (``pattern``, ``format``, bounds split across
``allOf`` members, ``uniqueItems``...) is never called empty; the backends refuse those.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import jsonschema

from grammarserve.fsm.schema.tree import resolve_pointer

_ALL = frozenset({"null", "boolean", "integer", "number", "string", "array", "object"})


@dataclass(frozen=True)
class Emptiness:
    """Why a subschema has no instance: ``keyword`` (under the subschema) and a message."""

    keyword: str
    message: str


class Context:
    """The root schema, with a validator over it and memoized type sets."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self._types: dict[int, frozenset[str]] = {}
        self._active: set[int] = set()
        self._validator: jsonschema.Draft202012Validator | None = None

    def validator(self, node: dict[str, Any]) -> jsonschema.Draft202012Validator:
        """A validator of ``node`` whose ``$ref``s resolve in the root."""
        if self._validator is None:
            self._validator = jsonschema.Draft202012Validator(self.root)
        return self._validator.evolve(schema=node)

    def types(self, node: Any) -> frozenset[str]:
        """The JSON types a value of ``node`` may have, as far as ``type``, ``const``/``enum``,
        ``allOf``, ``$ref`` and ``anyOf``/``oneOf`` say (``number`` includes ``integer``)."""
        if isinstance(node, bool) or not isinstance(node, dict):
            return _ALL if node is not False else frozenset()
        key = id(node)
        if key in self._types:
            return self._types[key]
        if key in self._active:  # a cycle through allOf / $ref: say nothing more
            return _ALL
        self._active.add(key)
        try:
            out = own_types(node)
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                try:
                    out &= self.types(resolve_pointer(self.root, ref))
                except (KeyError, IndexError, ValueError):
                    pass  # an unresolved $ref is refused elsewhere
            for member in _list(node, "allOf"):
                out &= self.types(member)
            for key_ in ("anyOf", "oneOf"):
                members = _list(node, key_)
                if members:
                    out &= frozenset().union(*(self.types(m) for m in members))
        finally:
            self._active.discard(key)
        self._types[key] = out
        return out


def own_types(node: dict[str, Any]) -> frozenset[str]:
    """The types ``node``'s own ``type`` and ``const`` / ``enum`` allow."""
    t = node.get("type")
    if isinstance(t, str):
        out = _widen({t})
    elif isinstance(t, list):
        out = _widen({x for x in t if isinstance(x, str)})
    else:
        out = _ALL
    if "const" in node:
        out &= _value_types(node["const"])
    if isinstance(node.get("enum"), list):
        out &= frozenset().union(*(_value_types(v) for v in node["enum"]))
    return out


def own_emptiness(ctx: Context, node: dict[str, Any]) -> Emptiness | None:
    """Why ``node``'s own keywords admit no value, or None when some value may satisfy them
    (or the case is not modelled)."""
    if "const" in node or "enum" in node:
        return _candidates_empty(ctx, node)
    types = ctx.types(node)
    if not types:
        keyword = next((k for k in ("type", "allOf", "$ref", "anyOf", "oneOf") if k in node),
                       "type")
        return Emptiness(keyword, _type_conflict(ctx, node))
    reasons = [_type_empty(node, t) for t in _distinct(types)]
    if all(r is not None for r in reasons):
        return reasons[0]
    return None


def possible_types(ctx: Context, node: dict[str, Any]) -> list[str]:
    """The types of which ``node``'s own keywords allow some value (``number`` stands for
    ``integer`` too when both are allowed)."""
    return [t for t in _distinct(ctx.types(node)) if _type_empty(node, t) is None]


def _distinct(types: frozenset[str]) -> list[str]:
    return sorted(types - {"integer"} if "number" in types else types)


def _type_conflict(ctx: Context, node: dict[str, Any]) -> str:
    parts = [f"'type' allows {_show(own_types(node))}"] if "type" in node else []
    if "const" in node or "enum" in node:
        parts.append(f"its values are {_show(own_types({}) & own_types(node))}")
    ref = node.get("$ref")
    if isinstance(ref, str):
        try:
            parts.append(_part(f"its $ref {ref}", ctx, resolve_pointer(ctx.root, ref)))
        except (KeyError, IndexError, ValueError):
            pass
    parts += [_part(f"allOf[{i}]", ctx, m) for i, m in enumerate(_list(node, "allOf"))]
    for key in ("anyOf", "oneOf"):
        members = _list(node, key)
        if members and all(m is False for m in members):
            parts.append(f"every member of '{key}' is false")
        elif members:
            parts.append(f"'{key}' allows " + _show(frozenset().union(
                *(ctx.types(m) for m in members))))
    return "no value satisfies all of it: " + "; ".join(parts)


def _part(name: str, ctx: Context, sub: Any) -> str:
    return f"{name} is false" if sub is False else f"{name} allows {_show(ctx.types(sub))}"


def _show(types: frozenset[str]) -> str:
    shown = sorted(types - {"integer"} if "number" in types else types)
    if len(shown) == len(_ALL) - 1:
        return "any type"
    return ", ".join(shown) if shown else "no type"


def _candidates_empty(ctx: Context, node: dict[str, Any]) -> Emptiness | None:
    if "const" in node:
        keyword, values = "const", [node["const"]]
    else:
        keyword, values = "enum", node["enum"]
        if not isinstance(values, list):
            return None  # not a schema; meta-validation refuses it
        if not values:
            return Emptiness("enum", "'enum' is empty, so no value is allowed")
    validator = ctx.validator(node)
    first_error = None
    for value in values:
        try:
            error = next(iter(validator.iter_errors(value)), None)
        except Exception:  # noqa: BLE001 - e.g. a pattern Python's re cannot read: not modelled
            return None
        if error is None:
            return None
        first_error = first_error or error
    assert first_error is not None
    if keyword == "const":
        return Emptiness(keyword, "its 'const' does not satisfy the rest of the subschema "
                                  f"({first_error.message})")
    return Emptiness(keyword, f"none of its {len(values)} 'enum' values satisfies the rest of "
                              f"the subschema (e.g. {first_error.message})")


def _type_empty(node: dict[str, Any], t: str) -> Emptiness | None:
    if t == "string":
        return _range_empty(node, "minLength", "maxLength")
    if t in ("number", "integer"):
        return _number_empty(node, integer=t == "integer" or node.get("type") == "integer")
    if t == "array":
        return _range_empty(node, "minItems", "maxItems") or _items_empty(node)
    if t == "object":
        return _range_empty(node, "minProperties", "maxProperties") or _object_empty(node)
    return None


def _range_empty(node: dict[str, Any], low: str, high: str) -> Emptiness | None:
    lo, hi = _int(node.get(low)), _int(node.get(high))
    if lo is not None and hi is not None and lo > hi:
        return Emptiness(low, f"{low} ({lo}) is greater than {high} ({hi})")
    return None


def _items_empty(node: dict[str, Any]) -> Emptiness | None:
    need, prefix = _int(node.get("minItems")), _list(node, "prefixItems")
    if node.get("items") is False and need is not None and need > len(prefix):
        return Emptiness("minItems", f"minItems ({need}) needs more items than the "
                                     f"{len(prefix)} 'prefixItems' that 'items': false allows")
    return None


def _object_empty(node: dict[str, Any]) -> Emptiness | None:
    required = {k for k in _list(node, "required") if isinstance(k, str)}
    most = _int(node.get("maxProperties"))
    if most is not None and len(required) > most:
        return Emptiness("maxProperties", f"maxProperties ({most}) is less than the "
                                          f"{len(required)} 'required' properties")
    found = node.get("properties")
    props: dict[str, Any] = found if isinstance(found, dict) else {}
    closed = node.get("additionalProperties") is False and not node.get("patternProperties")
    for key in sorted(required):
        if props.get(key) is False or (closed and key not in props):
            return Emptiness("required", f"the required property {key!r} is not allowed "
                                         "(its subschema is false, or additionalProperties is "
                                         "false and it is not in 'properties')")
    if node.get("propertyNames") is False and (required or node.get("minProperties", 0)):
        return Emptiness("propertyNames", "'propertyNames': false allows no property, yet "
                                          "some are required")
    return None


def _number_empty(node: dict[str, Any], *, integer: bool) -> Emptiness | None:
    lo, lo_open = _bound(node, "minimum", "exclusiveMinimum", lower=True)
    hi, hi_open = _bound(node, "maximum", "exclusiveMaximum", lower=False)
    step = _fraction(node.get("multipleOf"))
    if integer:
        if lo is not None:
            lo, lo_open = Fraction(math.floor(lo) + 1 if lo_open else math.ceil(lo)), False
        if hi is not None:
            hi, hi_open = Fraction(math.ceil(hi) - 1 if hi_open else math.floor(hi)), False
        if step is not None and step.denominator != 1:
            step = None  # integers that are multiples of a fraction: not modelled
    if lo is None or hi is None:
        return None
    keyword = "minimum" if "minimum" in node else "exclusiveMinimum"
    if lo > hi or (lo == hi and (lo_open or hi_open)):
        what = "integer" if integer else "number"
        return Emptiness(keyword, f"no {what} satisfies both {_bounds(node)}")
    if step is not None and step > 0:
        first = math.ceil(lo / step) * step
        if first == lo and lo_open:
            first += step
        if first > hi or (first == hi and hi_open):
            return Emptiness("multipleOf", f"no multiple of {node['multipleOf']} satisfies "
                                           f"{_bounds(node)}")
    return None


def _bounds(node: dict[str, Any]) -> str:
    return " and ".join(f"{k} {node[k]}" for k in ("minimum", "exclusiveMinimum", "maximum",
                                                  "exclusiveMaximum") if k in node)


def _bound(node: dict[str, Any], closed: str, open_: str, *,
           lower: bool) -> tuple[Fraction | None, bool]:
    """The tighter of a closed and an open bound (an open one wins a tie)."""
    found = [(v, is_open) for v, is_open in ((_fraction(node.get(closed)), False),
                                             (_fraction(node.get(open_)), True))
             if v is not None]
    if not found:
        return None, False
    return max(found, key=lambda c: (c[0] if lower else -c[0], c[1]))


def _fraction(x: Any) -> Fraction | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return Fraction(x) if isinstance(x, int) else Fraction(repr(x))


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _widen(types: set[str]) -> frozenset[str]:
    return frozenset(types | {"integer"} if "number" in types else types) & _ALL


def _value_types(value: Any) -> frozenset[str]:
    if value is None:
        return frozenset({"null"})
    if isinstance(value, bool):
        return frozenset({"boolean"})
    if isinstance(value, int):
        return frozenset({"integer", "number"})
    if isinstance(value, float):
        return frozenset({"integer", "number"} if value.is_integer() else {"number"})
    if isinstance(value, str):
        return frozenset({"string"})
    if isinstance(value, list):
        return frozenset({"array"})
    if isinstance(value, dict):
        return frozenset({"object"})
    return _ALL


def _list(node: dict[str, Any], key: str) -> list[Any]:
    value = node.get(key)
    return value if isinstance(value, list) else []
