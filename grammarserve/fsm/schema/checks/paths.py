"""Schema paths for the value checks (``schema/checks/split.py``): a path split into keyword steps, walked
from a node to the instance location its value sits at, and whether the steps below a location
only widen the whole when a keyword there is dropped."""

from __future__ import annotations

from typing import Any

from grammarserve.fsm.schema.tree import Parts
from grammarserve.fsm.value_check import Step

Anchor = tuple[tuple[Step, ...], Parts, bool]  # location, schema path of its node, exact

#: Path steps below a check's location where removing a keyword only widens the whole.
MONOTONE = frozenset({"anyOf", "allOf", "properties", "items", "prefixItems",
                      "additionalProperties", "patternProperties", "then", "else",
                      "dependentSchemas", "contains", "propertyNames"})
#: Keywords whose path step carries a name or an index after the keyword.
NAMED = frozenset({"properties", "patternProperties", "$defs", "definitions",
                   "dependentSchemas", "anyOf", "allOf", "oneOf", "prefixItems"})


def monotone_below(base: Parts, segs: list[Parts], widening: Parts | None) -> bool:
    """Whether dropping a keyword below ``segs`` (from the node at ``base``) widens the node
    at ``base``: each step is monotone, or is the ``oneOf`` being widened into ``anyOf``."""
    where = base
    for seg in segs:
        widened = widening is not None and len(widening) == len(where) + 1 \
            and starts_with(widening, where + seg[:1])
        if seg[0] not in MONOTONE and not widened:
            return False
        where = where + seg
    return True


def walk_to_location(root: dict[str, Any], location: tuple[Step, ...], base: Parts,
          segs: list[Parts], widening: Parts | None = None) -> Anchor | None:
    """Follow ``segs`` from the node at ``base`` (at instance ``location``) through location
    steps; the rest must be monotone."""
    loc = list(location)
    node_parts = base
    for i, seg in enumerate(segs):
        node = node_at(root, node_parts)
        step = location_step(node, seg)
        if step is None:
            if not monotone_below(node_parts, segs[i:], widening):
                return None
            return tuple(loc), node_parts, False
        if step != ("same", None):
            loc.append(step)
        node_parts = node_parts + seg
    return tuple(loc), node_parts, True


def location_step(node: Any, seg: Parts) -> Step | None:
    if not isinstance(node, dict):
        return None
    key = seg[0]
    if key == "properties":
        return ("key", seg[1])
    if key == "prefixItems":
        return ("index", seg[1])
    if key == "items":
        prefix = node.get("prefixItems")
        return ("from", len(prefix) if isinstance(prefix, list) else 0)
    if key == "additionalProperties" and "patternProperties" not in node:
        return ("other", tuple(node.get("properties") or {}))
    if key == "allOf":
        return ("same", None)
    return None


def segments(parts: Parts) -> list[Parts]:
    """``("properties", "a", "items")`` -> ``[("properties", "a"), ("items",)]``."""
    out: list[Parts] = []
    i = 0
    while i < len(parts):
        key = parts[i]
        take = 2 if key in NAMED and i + 1 < len(parts) else 1
        out.append(tuple(parts[i:i + take]))
        i += take
    return out


def starts_with(parts: Parts, prefix: Parts) -> bool:
    """Whether ``prefix`` is a prefix of ``parts`` (steps compared as text: ``0`` == ``"0"``)."""
    if len(parts) < len(prefix):
        return False
    for a, b in zip(parts, prefix):
        if a != b and str(a) != str(b):
            return False
    return True


def text_prefixes(parts: Parts) -> frozenset[tuple[str, ...]]:
    """Every prefix of ``parts`` (the empty one included) with its steps as text: a path
    whose steps are all text starts ``parts`` iff it is one of them (see :func:`starts_with`)."""
    steps = tuple(str(p) for p in parts)
    return frozenset(steps[:i] for i in range(len(steps) + 1))


def node_at(root: Any, parts: Parts) -> Any:
    node = root
    for p in parts:
        node = node[p]
    return node
