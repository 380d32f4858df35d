"""Key order: an object's own ``properties`` are generated before those its applicators add.

llguidance merges an object schema's ``properties`` with those of its ``allOf``/``anyOf``/
``$ref``... in the order the keys stand in the schema object, so ``{"allOf": [...],
"properties": {"name": ..., "type": ...}}`` (a file written with sorted keys, or the branches our
``if``/``then`` rewrite adds) forces the branches' ``type`` before ``name``: the schema's own
order, the one a model reading it writes, would be refused. :func:`own_properties_first` moves
each ``properties`` before the first applicator of its object, so the order generated is the
object's own ``properties`` first, then what the applicators add, whatever order the document
had. Nothing else changes (pointers name keys, not positions)."""

from __future__ import annotations

from typing import Any

from grammarserve.fsm.schema.tree import iter_subschemas

#: The keywords whose subschemas add properties to their object's.
APPLICATORS = frozenset({"allOf", "anyOf", "oneOf", "$ref", "$dynamicRef", "if", "then",
                         "else", "dependentSchemas"})


def own_properties_first(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (changed in place) with every ``properties`` before its object's first
    applicator."""
    for node, _ in iter_subschemas(schema):
        if "properties" not in node or APPLICATORS.isdisjoint(node):
            continue
        keys = list(node)
        first = next(i for i, k in enumerate(keys) if k in APPLICATORS)
        if keys.index("properties") < first:
            continue
        items = list(node.items())
        node.clear()
        own = ("properties", items[keys.index("properties")][1])
        rest = [kv for kv in items if kv[0] != "properties"]
        node.update(rest[:first] + [own] + rest[first:])
    return schema
