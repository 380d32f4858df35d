"""Identical leaf subschemas shared through one ``$defs`` entry (the last front-end step).

llguidance builds a lexeme for every occurrence of a leaf subschema, so its compile time grows
with the occurrences, not with the distinct leaves: ten properties
``{"type": "integer", "minimum": -(2**53 - 1), "maximum": 2**53 - 1}`` (what ``schema/close.py``
gives every unbounded integer) took 10.5 ms to compile, against 1.5 ms as ten ``$ref``s to one
entry; a ``$ref`` target is compiled once. :func:`share_leaves` does that for every leaf that
occurs at least twice as a property value, ``items``, a ``prefixItems`` member or
``additionalProperties``.

A *leaf* has no subschema and no ``$ref`` (a string, number, integer, boolean or null with its
own bounds, pattern, format, enum or const). Leaves are compared without their annotations
(``title``, ``description``, ...), which assert nothing. The language is unchanged: a subschema
that is only a ``$ref`` means its target (Draft 2020-12), and the entry is the leaf itself.
Occurrences elsewhere (``anyOf`` members, whose leaves llguidance merges into one lexeme, and
the ``$defs`` entries themselves) are left as they are.
"""

from __future__ import annotations

import json
from typing import Any

from grammarserve.fsm.schema.tree import iter_subschemas

#: Keywords that assert nothing (compared away, left out of the shared entry).
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment",
                          "deprecated", "readOnly", "writeOnly"})
#: Keywords whose value is (or holds) a subschema or a reference: a node with one is no leaf.
_NOT_LEAF = frozenset({"items", "additionalProperties", "contains", "not", "if", "then", "else",
                       "propertyNames", "unevaluatedItems", "unevaluatedProperties",
                       "additionalItems", "properties", "patternProperties", "$defs",
                       "definitions", "dependentSchemas", "allOf", "anyOf", "oneOf",
                       "prefixItems", "$ref", "$dynamicRef", "$id", "$anchor",
                       "$dynamicAnchor", "dependencies"})
#: Entries are named with this prefix and a number.
PREFIX = "__shared"


def share_leaves(schema: Any) -> Any:
    """Replace each leaf that occurs at least twice in the positions above by a ``$ref`` to one
    copy in the root's ``$defs`` (in place; ``schema`` must be a private copy). Returns it."""
    if not isinstance(schema, dict):
        return schema
    slots: dict[str, list[tuple[dict[str, Any] | list[Any], str | int]]] = {}
    for sub, _ in iter_subschemas(schema):
        for holder, key in _slots(sub):
            leaf = holder[key]  # type: ignore[index]
            signature = _signature(leaf)
            if signature is not None:
                slots.setdefault(signature, []).append((holder, key))
    shared = [(sig, places) for sig, places in slots.items() if len(places) > 1]
    if not shared:
        return schema
    defs = schema.setdefault("$defs", {})
    if not isinstance(defs, dict):
        return schema
    n = 0
    for signature, places in shared:
        while f"{PREFIX}{n}" in defs:
            n += 1
        name = f"{PREFIX}{n}"
        defs[name] = json.loads(signature)
        for holder, key in places:
            holder[key] = {"$ref": f"#/$defs/{name}"}  # type: ignore[index]
    return schema


def _slots(sub: dict[str, Any]) -> list[tuple[dict[str, Any] | list[Any], str | int]]:
    """The positions of ``sub`` whose leaves are shared: (container, key or index)."""
    out: list[tuple[dict[str, Any] | list[Any], str | int]] = []
    props = sub.get("properties")
    if isinstance(props, dict):
        out.extend((props, name) for name in props)
    for key in ("items", "additionalProperties"):
        if isinstance(sub.get(key), dict):
            out.append((sub, key))
    prefix = sub.get("prefixItems")
    if isinstance(prefix, list):
        out.extend((prefix, i) for i in range(len(prefix)))
    return out


def _signature(node: Any) -> str | None:
    """The canonical text of ``node`` without annotations if it is a leaf that asserts more
    than its type, else None."""
    if not isinstance(node, dict) or not _NOT_LEAF.isdisjoint(node):
        return None
    asserted = {k: v for k, v in node.items() if k not in _ANNOTATIONS}
    if not set(asserted) - {"type"}:
        return None  # cheap for the backends as it is
    return json.dumps(asserted, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
