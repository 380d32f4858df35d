"""Which keywords the front end refuses, and where: keywords no backend enforces (unless the
rewrites remove them exactly), non-local or dangling ``$ref``s, ``$id`` below the root, patterns
the backends would read otherwise than ``re``."""

from __future__ import annotations

from typing import Any

from grammarserve.errors import SchemaValidationError, UnsupportedSchemaError
from grammarserve.fsm.regex_superset import refuse_constructs
from grammarserve.fsm.schema.read.metaschemas import is_meta_ref
from grammarserve.fsm.schema.tree import (
    REWRITE_TRIGGERS,
    Parts,
    iter_subschemas,
    json_path,
    resolve_pointer,
)

#: Keywords refused wherever they appear (a backend would ignore them, or we cannot resolve
#: them), with the reason given to the user.
REFUSED_KEYWORDS: dict[str, str] = {
    "not": "negation cannot be enforced by the grammar",
    "dependentRequired": "conditional requirements cannot be enforced by the grammar",
    "dependentSchemas": "conditional subschemas cannot be enforced by the grammar",
    "contains": "'contains' (and min/maxContains) cannot be enforced by the grammar",
    "unevaluatedItems": "'unevaluatedItems' cannot be enforced; use 'items' instead",
    "unevaluatedProperties": ("'unevaluatedProperties' cannot be enforced; use "
                              "'additionalProperties' instead"),
    "$dynamicRef": "dynamic references are not supported; use a local '$ref'",
    "$dynamicAnchor": "dynamic anchors are not supported; use '$defs' and a local '$ref'",
    "$recursiveRef": "recursive references are not supported; use a local '$ref'",
}


def check_keywords(schema: dict[str, Any], *, skip: frozenset[str] = frozenset()) -> bool:
    """Refuse unsupported keywords and non-local or dangling ``$ref``s (except the keywords
    in ``skip``, and then references into the meta-schemas). Returns whether, with ``skip``,
    the schema holds anything the rewrites would change."""
    pending = False
    for sub, parts in iter_subschemas(schema):
        if skip and not pending and not REWRITE_TRIGGERS.isdisjoint(sub):
            pending = True
        if skip and "not" in skip and "not" in parts:
            continue  # negated: either rewritten exactly or refused as a whole
        for key, reason in REFUSED_KEYWORDS.items():
            if key in sub and key not in skip and not _is_trivial(key, sub[key]):
                where = json_path(parts + (key,))
                raise UnsupportedSchemaError(f"unsupported keyword '{key}' at {where}: {reason}",
                                             path=where, keyword=key)
        if sub.get("uniqueItems") is True and "uniqueItems" not in skip:
            where = json_path(parts + ("uniqueItems",))
            raise UnsupportedSchemaError(
                f"unsupported keyword 'uniqueItems' at {where}: item uniqueness cannot be "
                "enforced by the grammar (use an 'enum' of items or drop the constraint)",
                path=where, keyword="uniqueItems")
        if "if" in sub and ("then" in sub or "else" in sub) and "if" not in skip:
            where = json_path(parts + ("if",))
            raise UnsupportedSchemaError(
                f"unsupported keyword 'if' at {where}: if/then/else cannot be enforced by the "
                "grammar; use 'anyOf' of the cases", path=where, keyword="if")
        _check_patterns(sub, parts, checkable_ok=bool(skip))
        if parts and "$id" in sub:
            where = json_path(parts + ("$id",))
            raise UnsupportedSchemaError(
                f"unsupported keyword '$id' at {where}: only the root may set '$id'",
                path=where, keyword="$id")
        if "$ref" in sub:
            if skip and is_meta_ref(sub["$ref"]):
                pending = True
            else:
                _check_ref(schema, sub["$ref"], parts)
    return pending


def _check_patterns(sub: dict[str, Any], parts: Parts, *,
                    checkable_ok: bool) -> None:
    """Refuse a pattern with what the backends do not read as ``re`` does
    (``regex_superset.py``): before the rewrites what no value check stands for, after them
    whatever the checks did not take."""
    if "pattern" in sub:
        refuse_constructs(sub["pattern"], json_path(parts + ("pattern",)), "pattern",
                          checkable_ok=checkable_ok)
    if isinstance(sub.get("patternProperties"), dict):
        for name in sub["patternProperties"]:
            refuse_constructs(name, json_path(parts + ("patternProperties", name)),
                              "patternProperties", checkable_ok=checkable_ok)


def _is_trivial(key: str, value: Any) -> bool:
    return key in ("dependentRequired", "dependentSchemas") and value == {}


def _check_ref(root: dict[str, Any], ref: Any, parts: Parts) -> None:
    where = json_path(parts + ("$ref",))
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise UnsupportedSchemaError(
            f"remote $ref {ref!r} at {where} is not supported: only local references "
            "('#/$defs/Name') are resolved; inline the referenced schema", path=where,
            keyword="$ref")
    if ref not in ("#",) and not ref.startswith("#/"):
        raise UnsupportedSchemaError(
            f"$ref {ref!r} at {where} uses an anchor; only JSON-pointer references "
            "('#/$defs/Name') are supported", path=where, keyword="$ref")
    try:
        resolve_pointer(root, ref)
    except (KeyError, IndexError, ValueError):
        raise SchemaValidationError(f"$ref {ref!r} at {where} does not resolve in this schema",
                                    path=where) from None


