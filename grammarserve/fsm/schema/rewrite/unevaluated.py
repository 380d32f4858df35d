"""``unevaluatedProperties``/``unevaluatedItems`` -> ``additionalProperties``/``items`` where
that is exact.

``unevaluatedProperties: S`` applies to the members no adjacent keyword evaluated: those
``properties``/``patternProperties``/``additionalProperties`` did not, and those no in-place
applicator (``allOf``, ``anyOf``, ``oneOf``, ``$ref``, ``if``/``then``/``else``,
``dependentSchemas``, ``$dynamicRef``) evaluated. With no in-place applicator beside it, that
is exactly what ``additionalProperties: S`` applies to, and it leaves the same annotations; if
``additionalProperties`` is already there, every member is evaluated and it means nothing.
Likewise ``unevaluatedItems: S`` is ``items: S`` (after ``prefixItems``) when neither an
applicator nor ``contains`` (which evaluates the items it matches) stands beside it. (``not``
leaves no annotations, so it does not count.) The others are left as they are, for the
run-time checks (``schema/checks/plan.py``) or the front end's refusal.
"""

from __future__ import annotations

from typing import Any

from grammarserve.fsm.schema.rewrite.negated import refuse_if_referenced
from grammarserve.fsm.schema.tree import iter_subschemas

_IN_PLACE = ("allOf", "anyOf", "oneOf", "$ref", "$dynamicRef", "if", "then", "else",
             "dependentSchemas")


def rewrite_unevaluated(schema: dict[str, Any]) -> dict[str, Any]:
    """Apply the rewrites above to ``schema`` (in place) and return it."""
    for sub, parts in list(iter_subschemas(schema)):
        if any(k in sub for k in _IN_PLACE):
            continue
        for key, plain in (("unevaluatedProperties", "additionalProperties"),
                           ("unevaluatedItems", "items")):
            if key not in sub or (key == "unevaluatedItems" and "contains" in sub):
                continue
            refuse_if_referenced(schema, parts + (key,), key)
            value = sub.pop(key)
            if plain not in sub:
                sub[plain] = value
    return schema
