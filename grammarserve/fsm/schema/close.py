"""Generate only what a schema names: the default of ``open_schemas=False``.

A schema that lists ``properties`` but says nothing of ``additionalProperties`` (as Pydantic
emits) allows any other key, and a small model uses that to invent keys until ``max_tokens``
(``"population_density"``, ``"population_density_miles_per_acre"``, ...). Likewise an
unbounded integer may never end. :func:`close_schema` narrows such a schema to a subset of its
instances that a model can finish; every instance of the result is valid against the input:

- an object subschema with ``properties`` and no word on other keys gets
  ``additionalProperties: false``;
- an array subschema with ``prefixItems`` and no ``items`` gets ``items: false``;
- an integer subschema without a bound gets ``-(2**53 - 1) <= n <= 2**53 - 1``.

A rewrite is skipped where it could empty the language or change what another keyword sees:
``required`` keys (or ``minProperties``/``minItems``) beyond the named ones, subschemas beside
``allOf``/``anyOf``/``oneOf``/``$ref``/``not``/``if``/``dependentSchemas``/``unevaluated*``,
subschemas under a condition or negation, and the members of an ``allOf`` (or of an
``anyOf``/``oneOf`` beside other constraints), with the ``$ref`` targets they use, whose keys
other schemas may add. The digit bound (``runs.py``) completes this for the fractions of numbers.
"""

from __future__ import annotations

import re
from typing import Any

from grammarserve.fsm.runs import MAX_DIGITS
from grammarserve.fsm.schema.tree import iter_subschemas, resolve_pointer

MAX_SAFE_INTEGER = 2**53 - 1
_COMPOSED = ("allOf", "anyOf", "oneOf", "$ref", "not", "if", "dependentSchemas",
             "unevaluatedProperties", "unevaluatedItems")
#: Subschemas under these are conditions or negations: narrowing them changes the meaning.
_CONDITIONS = frozenset({"not", "if", "then", "else", "propertyNames", "contains",
                         "dependentSchemas"})
_OPEN_KEYS = ("additionalProperties", "patternProperties", "propertyNames")
#: Keys of a subschema that is only a union (its members then stand alone).
_BARE = frozenset({"anyOf", "oneOf", "allOf", "title", "description", "default", "examples",
                   "$comment", "$defs", "definitions", "$schema", "$id",
                   "discriminator"})  # an OpenAPI annotation Pydantic puts beside oneOf
_LONG_NUMBER = re.compile(rf"\d{{{MAX_DIGITS + 1},}}")


def close_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Apply the rewrites above to ``schema`` in place (a private copy) and return it."""
    nodes = list(iter_subschemas(schema))  # NOTE: the rewrites below add no subschema
    shared = _shared_members(schema, nodes)
    for sub, path in nodes:
        if (id(sub) in shared or any(k in sub for k in _COMPOSED)
                or any(p in _CONDITIONS for p in path)):
            continue
        _close_object(sub)
        _close_array(sub)
        _bound_integer(sub)
    return schema


def has_long_numbers(source: str) -> bool:
    """True if the schema text holds a run of more than ``MAX_DIGITS`` digits (a ``const``,
    ``enum`` or bound the digit-run limit would make unreachable)."""
    return _LONG_NUMBER.search(source) is not None


def _types(sub: dict[str, Any]) -> set[str]:
    t = sub.get("type")
    return {t} if isinstance(t, str) else set(t) if isinstance(t, list) else set()


def _close_object(sub: dict[str, Any]) -> None:
    props = sub.get("properties")
    if not isinstance(props, dict) or any(k in sub for k in _OPEN_KEYS):
        return
    required = sub.get("required", [])
    if not isinstance(required, list) or not set(required) <= set(props):
        return
    if not isinstance(sub.get("minProperties", 0), int) or sub.get("minProperties", 0) > len(props):
        return
    sub["additionalProperties"] = False


def _close_array(sub: dict[str, Any]) -> None:
    prefix = sub.get("prefixItems")
    if not isinstance(prefix, list) or "items" in sub or "contains" in sub:
        return
    min_items = sub.get("minItems", 0)
    if isinstance(min_items, int) and min_items <= len(prefix):
        sub["items"] = False


def _bound_integer(sub: dict[str, Any]) -> None:
    if "integer" not in _types(sub) or "enum" in sub or "const" in sub:
        return
    if "minimum" not in sub and "exclusiveMinimum" not in sub:
        sub["minimum"] = -MAX_SAFE_INTEGER
    if "maximum" not in sub and "exclusiveMaximum" not in sub:
        sub["maximum"] = MAX_SAFE_INTEGER


def _shared_members(schema: dict[str, Any],
                    nodes: list[tuple[dict[str, Any], tuple[str | int, ...]]]) -> set[int]:
    """ids of the combinator members whose keys another schema may add (with the subschemas
    their ``$ref`` chains reach): every ``allOf`` member, the ``anyOf``/``oneOf`` members of
    a subschema that has constraints of its own beside them, and the branches of shared
    members."""
    out: set[int] = set()
    for sub, _ in nodes:
        members = list(sub.get("allOf", [])) if isinstance(sub.get("allOf"), list) else []
        if set(sub) - _BARE:
            for key in ("anyOf", "oneOf"):
                if isinstance(sub.get(key), list):
                    members.extend(sub[key])
        while members:
            member = members.pop()
            for _ in range(8):  # a chain of references, bounded
                if not isinstance(member, dict) or id(member) in out:
                    break
                out.add(id(member))
                # NOTE: the branches of a shared union stand beside the same other schemas
                # (``allOf: [{anyOf: [...]}]`` next to the properties the branches must allow)
                for key in ("anyOf", "oneOf"):
                    if isinstance(member.get(key), list):
                        members.extend(member[key])
                ref = member.get("$ref")
                if not (isinstance(ref, str) and ref.startswith("#")):
                    break
                try:
                    member = resolve_pointer(schema, ref)
                except (KeyError, ValueError, IndexError):
                    break
    return out
