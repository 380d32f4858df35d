"""OpenAI strict-mode rules (``strict=True``), with OpenAI-style error messages.

See ``reference/openai-api.md`` section 3: root is a non-``anyOf`` object, every object has
``additionalProperties: false`` and lists every property in ``required``, only the supported
keywords, nesting depth <= 10, <= 5000 properties, <= 1000 enum values.
"""

from __future__ import annotations

from typing import Any

from grammarserve.errors import StrictSchemaError
from grammarserve.fsm.schema.tree import iter_subschemas, json_path

_UNSUPPORTED = ("allOf", "not", "dependentRequired", "dependentSchemas", "if", "then", "else",
                "patternProperties", "propertyNames", "minProperties", "maxProperties",
                "uniqueItems", "contains", "minContains", "maxContains", "oneOf",
                "unevaluatedProperties", "unevaluatedItems")
#: Formats OpenAI strict mode supports (and our backends enforce).
STRICT_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4",
                            "ipv6", "uuid"})
MAX_DEPTH = 10
MAX_PROPERTIES = 5000
MAX_ENUM_VALUES = 1000


def _context(parts: tuple[str | int, ...]) -> str:
    return "context=(" + ", ".join(repr(p) for p in parts) + ("," if len(parts) == 1 else "") + ")"


def _fail(parts: tuple[str | int, ...], message: str) -> StrictSchemaError:
    return StrictSchemaError(f"Invalid schema: In {_context(parts)}, {message}",
                             path=json_path(parts))


def check_strict(schema: dict[str, Any]) -> None:
    """Raise :class:`StrictSchemaError` unless ``schema`` is in OpenAI's strict subset."""
    if "anyOf" in schema:
        raise _fail((), "schema must be a JSON Schema of 'type: \"object\"', got 'type: "
                        "\"None\"' (the root must not be 'anyOf').")
    if _types(schema) != {"object"}:
        raise _fail((), f"schema must be a JSON Schema of 'type: \"object\"', got 'type: "
                        f"\"{schema.get('type')}\"'.")
    n_props = n_enum = 0
    for sub, parts in iter_subschemas(schema):
        for key in _UNSUPPORTED:
            if key in sub:
                raise _fail(parts, f"'{key}' is not permitted.")
        fmt = sub.get("format")
        if fmt is not None and fmt not in STRICT_FORMATS:
            raise _fail(parts, f"'format' {fmt!r} is not permitted; supported formats are "
                               f"{sorted(STRICT_FORMATS)}.")
        if _depth(parts) > MAX_DEPTH:
            raise _fail(parts, f"nesting depth exceeds the limit of {MAX_DEPTH} levels.")
        n_enum += len(sub.get("enum", []) or [])
        if "object" in _types(sub) or "properties" in sub:
            props = sub.get("properties", {}) or {}
            n_props += len(props)
            if sub.get("additionalProperties") is not False:
                raise _fail(parts, "'additionalProperties' is required to be supplied and to "
                                   "be false.")
            missing = [k for k in props if k not in (sub.get("required") or [])]
            if missing:
                raise _fail(parts, "'required' is required to be supplied and to be an array "
                                   "including every key in properties. Missing "
                                   f"{', '.join(repr(m) for m in missing)}.")
    if n_props > MAX_PROPERTIES:
        raise _fail((), f"the schema has {n_props} object properties in total; the limit is "
                        f"{MAX_PROPERTIES}.")
    if n_enum > MAX_ENUM_VALUES:
        raise _fail((), f"the schema has {n_enum} enum values in total; the limit is "
                        f"{MAX_ENUM_VALUES}.")


def _types(sub: dict[str, Any]) -> set[str]:
    t = sub.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    return set()


def _depth(parts: tuple[str | int, ...]) -> int:
    # NOTE: one level per object property or array item step; $defs entries start over.
    if "$defs" in parts or "definitions" in parts:
        last = max(i for i, p in enumerate(parts) if p in ("$defs", "definitions"))
        parts = parts[last + 2:]
    return sum(1 for p in parts if p in ("properties", "items", "prefixItems"))
