"""``not`` -> its exact negation (``schema/algebra/negate.py``), merged into the subschema that carries it.

``{"type": "object", "not": {"required": ["a"]}}`` becomes ``{"type": "object",
"properties": {"a": false}}``; ``{"type": "string", "not": {"enum": ["x"]}}`` gets a pattern
that matches every other string. The negation is restricted to the types the carrying
subschema allows (exact, since that subschema keeps its ``type``), then merged into it where
no keyword of it reads the merged ones differently, else added as ``anyOf`` (or an ``allOf``
member). A ``not`` without an exact rewrite is refused with its path, naming what stops it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grammarserve.errors import UnsupportedSchemaError
from grammarserve.fsm.schema.algebra.negate import Negator
from grammarserve.fsm.schema.algebra.typed_union import (
    Unexpressible,
    conjoin,
    domains_of,
    emit,
    restrict,
)
from grammarserve.fsm.schema.tree import iter_subschemas, json_path

_GROUPS = (frozenset({"properties", "patternProperties", "additionalProperties",
                      "unevaluatedProperties"}),
           frozenset({"items", "prefixItems", "unevaluatedItems"}),
           frozenset({"contains", "minContains", "maxContains"}),
           frozenset({"if", "then", "else"}))
_LOWER = frozenset({"minLength", "minItems", "minProperties", "minimum", "exclusiveMinimum"})
_UPPER = frozenset({"maxLength", "maxItems", "maxProperties", "maximum", "exclusiveMaximum"})


#: Offered a keyword without an exact rewrite (its subschema's path, the keyword); True if it
#: took it (``checks.CheckCollector.take``: removed, to be checked at run time).
Leftover = Callable[[tuple[str | int, ...], str], bool]


def rewrite_not(schema: dict[str, Any], leftover: Leftover | None = None, *,
                prefer: bool = False) -> dict[str, Any]:
    """Replace every ``not`` of ``schema`` (in place) by its exact negation; raise
    :class:`UnsupportedSchemaError` at the first one that has none, unless ``leftover`` takes
    it (with ``prefer``, ``leftover`` is offered each ``not`` first). One inside another
    ``not`` that neither holds is left for the outer one (whose negation may undo it)."""
    negator = Negator(schema)
    for sub, parts in reversed(list(iter_subschemas(schema))):
        if "not" not in sub:
            continue
        if prefer and leftover is not None and leftover(parts, "not"):
            continue
        where = json_path(parts + ("not",))
        refuse_if_referenced(schema, parts + ("not",), "not")
        try:
            negated = emit(restrict(negator.negative(sub["not"]), domains_of(sub.get("type"))))
        except Unexpressible as e:
            if leftover is not None and leftover(parts, "not"):
                continue
            if "not" in parts:
                continue  # negated itself: the outer not is rewritten whole, or refused
            raise UnsupportedSchemaError(
                f"unsupported keyword 'not' at {where}: it has no exact rewrite the grammar can "
                f"enforce ({e}); state the allowed values positively instead",
                path=where, keyword="not") from None
        if negated is False and _replace_by_false(schema, parts):
            continue
        if negated is False:
            raise UnsupportedSchemaError(
                f"unsupported keyword 'not' at {where}: it excludes every value the subschema "
                "allows, so nothing could be generated", path=where, keyword="not")
        del sub["not"]
        attach(sub, negated)
    return schema


def _replace_by_false(root: dict[str, Any], parts: tuple[str | int, ...]) -> bool:
    """Write the subschema at ``parts`` as ``false`` (it accepts nothing); every position but
    the root may hold a boolean schema."""
    if not parts:
        return False
    container: Any = root
    for p in parts[:-1]:
        container = container[p]
    container[parts[-1]] = False
    return True


def refuse_if_referenced(root: dict[str, Any], parts: tuple[str | int, ...], keyword: str
                         ) -> None:
    """Refuse a rewrite that would move a subschema some ``$ref`` points into."""
    pointer = "#" + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)
    for sub, _ in iter_subschemas(root):
        ref = sub.get("$ref")
        if isinstance(ref, str) and (ref == pointer or ref.startswith(pointer + "/")):
            where = json_path(parts)
            raise UnsupportedSchemaError(
                f"unsupported keyword '{keyword}' at {where}: a '$ref' points into it, so it "
                "cannot be rewritten; move the referenced part into '$defs'", path=where,
                keyword=keyword)


def attach(node: dict[str, Any], extra: Any) -> None:
    """Add the constraint ``extra`` to ``node`` (in place): ``node`` then means ``node`` and
    ``extra``. Merged key by key where that is exact, else as ``anyOf`` / an ``allOf``
    member."""
    if extra is True or extra == {}:
        return
    if isinstance(extra, dict):
        merged = _merged(node, extra)
        if merged is not None:
            node.clear()
            node.update(merged)
            return
        if set(extra) == {"anyOf"} and "anyOf" not in node:
            node["anyOf"] = extra["anyOf"]
            return
    node.setdefault("allOf", []).append(extra)


def combine(a: Any, b: Any) -> Any:
    """``a`` and ``b`` as one schema (merged where exact, else ``allOf``)."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return conjoin(a, b)
    out = dict(a)
    attach(out, b)
    return out


def _merged(node: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any] | None:
    out = dict(node)
    for key, value in extra.items():
        group = next((g for g in _GROUPS if key in g), None)
        if group is not None and key != "properties" and group & set(node) - {key}:
            return None
        if key == "properties":
            props = _merge_properties(node, value)
            if props is None:
                return None
            out[key] = props
        elif key not in node:
            out[key] = value
        elif key == "type":
            if not set(domains_of(value)) <= set(domains_of(node["type"])):
                return None
            out[key] = value
        elif key in _LOWER:
            out[key] = max(node[key], value)
        elif key in _UPPER:
            out[key] = min(node[key], value)
        elif key == "required":
            out[key] = list(dict.fromkeys(list(node[key]) + list(value)))
        elif key == "allOf":
            out[key] = list(node[key]) + list(value)
        elif node[key] != value:
            return None
    return out


def _merge_properties(node: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any] | None:
    props = dict(node.get("properties") or {})
    readers = {"additionalProperties", "unevaluatedProperties"} & set(node)
    for name, sub in extra.items():
        if name in props:
            props[name] = conjoin(props[name], sub)
        elif readers and sub is not False and not (
                set(readers) == {"additionalProperties"} and node["additionalProperties"]
                in (True, {})):
            return None  # naming the key would hide it from additionalProperties
        elif "unevaluatedProperties" in readers:
            return None
        else:
            props[name] = sub
    return props
