"""JSON Schema front end: parse, meta-validate (Draft 2020-12), check ``$ref``s are local and
resolvable, and refuse keywords that no backend enforces (instead of dropping them silently)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import unquote

from grammarserve.errors import SchemaValidationError, UnsupportedSchemaError
from grammarserve.fsm.metavalidate import meta_validate
from grammarserve.fsm.regex_superset import refuse_constructs

# Keywords whose value is one subschema / a map of subschemas / a list of subschemas.
_ONE = ("items", "additionalProperties", "contains", "not", "if", "then", "else",
        "propertyNames", "unevaluatedItems", "unevaluatedProperties", "additionalItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")

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


def json_path(parts: tuple[str | int, ...]) -> str:
    """``("properties", "a", 0)`` -> ``$.properties.a[0]`` (``$`` is the schema root)."""
    out = "$"
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif p.isidentifier():
            out += f".{p}"
        else:
            out += f"[{json.dumps(p)}]"
    return out


#: The schema keywords in walk order, with the shape of their value (0: one subschema, 1: a map
#: of subschemas, 2: a list of subschemas).
_WALK = tuple((k, 0) for k in _ONE) + tuple((k, 1) for k in _MAP) + tuple((k, 2) for k in _LIST)
_WALK_KEYS = frozenset(k for k, _ in _WALK)


#: Each walked keyword's shape, and its place in the walk order.
_SHAPE = dict(_WALK)
_ORDER = {k: i for i, (k, _) in enumerate(_WALK)}


def iter_subschemas(schema: Any, path: tuple[str | int, ...] = ()
                    ) -> Iterator[tuple[dict[str, Any], tuple[str | int, ...]]]:
    """Yield every object subschema with its path (depth-first, schema positions only, so
    ``enum``/``const``/``default`` values are never mistaken for schemas).

    NOTE: one explicit stack, not nested generators (a ``yield from`` chain costs every item
    one step per level above it), and nodes without schema keywords are skipped with one set
    test: the front end walks each schema many times. A node's children (its schema keywords
    in ``_WALK`` order, each one's members in order) are pushed in reverse, so they come off
    the stack in order; they are read after the node is yielded, so a caller may still
    rewrite them first."""
    if not isinstance(schema, dict):
        return
    stack: list[tuple[dict[str, Any], tuple[str | int, ...]]] = [(schema, path)]
    push, pop = stack.append, stack.pop
    while stack:
        node, where = pop()
        yield node, where
        if _WALK_KEYS.isdisjoint(node):
            continue
        keys = [k for k in node if k in _SHAPE]
        if len(keys) > 1:
            keys.sort(key=_ORDER.__getitem__, reverse=True)
        for key in keys:
            value = node[key]
            shape = _SHAPE[key]
            if shape == 0:
                if isinstance(value, dict):
                    push((value, where + (key,)))
            elif shape == 1:
                if isinstance(value, dict):
                    for name, sub in reversed(value.items()):
                        if isinstance(sub, dict):
                            push((sub, where + (key, name)))
            elif isinstance(value, list):
                for i in range(len(value) - 1, -1, -1):
                    sub = value[i]
                    if isinstance(sub, dict):
                        push((sub, where + (key, i)))


def parse_schema(schema: dict[str, Any] | str | bool) -> dict[str, Any] | bool:
    """Parse a schema given as text; refuse values that cannot be a schema."""
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise SchemaValidationError(
                f"the schema is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}",
                path="$") from None
    if not isinstance(schema, (dict, bool)):
        raise SchemaValidationError(
            f"a JSON Schema must be an object or a boolean, got {type(schema).__name__}",
            path="$")
    return schema


#: Schemas nested deeper (JSON levels) are meta-validated by ``jsonschema`` alone: its verdict
#: there depends on Python's recursion limit ("nested too deeply"), and ``jsonschema_rs``'s
#: native recursion could overflow the stack.
_FAST_MAX_DEPTH = 200


class _TooDeep(Exception):
    pass


def copy_json(node: Any, depth: int = _FAST_MAX_DEPTH) -> Any:
    """A deep copy of a JSON document (dicts and lists copied, leaves shared: they are
    immutable), ~10x faster than ``copy.deepcopy``; raises ``_TooDeep`` past ``depth`` levels."""
    if depth <= 0:
        raise _TooDeep
    if isinstance(node, dict):
        return {k: copy_json(v, depth - 1) if isinstance(v, (dict, list)) else v
                for k, v in node.items()}
    if isinstance(node, list):
        return [copy_json(v, depth - 1) if isinstance(v, (dict, list)) else v for v in node]
    return node


def resolve_pointer(root: Any, ref: str) -> Any:
    """Resolve a local ``#/...`` JSON pointer; raise ``KeyError`` if it does not resolve."""
    node = root
    if ref in ("#", "#/"):
        return root
    for raw in ref[2:].split("/"):
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, list):
            node = node[int(part)]
        elif isinstance(node, dict):
            node = node[part]
        else:
            raise KeyError(part)
    return node


#: Keywords the front end's exact rewrites (``rewrite.py``) may remove.
REWRITABLE = frozenset({"not", "if", "dependentRequired", "dependentSchemas", "uniqueItems",
                        "unevaluatedProperties", "unevaluatedItems"})


#: What the rewrites may also hand to run-time value checks (``checks.py``).
CHECKED = frozenset({"contains"})

#: Keywords that make the rewrites worth running (some are removed without being refused).
_REWRITE_TRIGGERS = ("not", "if", "then", "else", "dependentRequired", "dependencies",
                     "dependentSchemas", "uniqueItems", "contains", "unevaluatedProperties",
                     "unevaluatedItems", "oneOf", "propertyNames", "minProperties",
                     "maxProperties", "pattern", "patternProperties")


def check_keywords(schema: dict[str, Any], *, skip: frozenset[str] = frozenset()) -> bool:
    """Refuse unsupported keywords and non-local or dangling ``$ref``s (except the keywords
    in ``skip``, and then references into the meta-schemas). Returns whether, with ``skip``,
    the schema holds anything the rewrites would change."""
    pending = False
    for sub, parts in iter_subschemas(schema):
        if skip and not pending and any(k in sub for k in _REWRITE_TRIGGERS):
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


def _check_patterns(sub: dict[str, Any], parts: tuple[str | int, ...], *,
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


def is_meta_ref(ref: Any) -> bool:
    """True if ``ref`` points into a JSON Schema meta-schema (bundled by ``metaschemas.py``)."""
    from grammarserve.fsm.metaschemas import is_meta_ref as meta  # NOTE: it imports us

    return meta(ref)


def _is_trivial(key: str, value: Any) -> bool:
    return key in ("dependentRequired", "dependentSchemas") and value == {}


def _check_ref(root: dict[str, Any], ref: Any, parts: tuple[str | int, ...]) -> None:
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


def prepare_schema(schema: dict[str, Any] | str | bool,
                   rewrite: Callable[[dict[str, Any]], dict[str, Any]] | None = None, *,
                   checked: bool = False) -> dict[str, Any]:
    """Parse, meta-validate and check ``schema``; return a deep copy ready for a backend
    (``true`` becomes ``{}``; ``false`` is refused since nothing can be generated).

    ``rewrite`` (``rewrite.rewrite_schema``) replaces keywords no backend enforces by exact
    equivalents, on the copy, before what is left is refused; the keywords it cannot touch are
    refused first, so a schema is refused for the same reason with or without it. ``checked``:
    the rewrite may also turn ``contains`` into run-time checks, so it is not refused first."""
    from grammarserve.fsm.drafts import to_draft_2020  # NOTE: it imports us
    from grammarserve.fsm.localrefs import hoist_ref_targets, localize_refs

    try:
        parsed = to_draft_2020(parse_schema(schema))
    except RecursionError:
        raise SchemaValidationError("the schema is nested too deeply", path="$") from None
    try:
        copied, shallow = copy_json(parsed), True
    except (_TooDeep, RecursionError):
        copied, shallow = None, False
    meta_validate(parsed, shallow=shallow)
    if parsed is True:
        return {}
    if parsed is False:
        raise SchemaValidationError("the schema `false` accepts no instance, so nothing can be "
                                    "generated", path="$")
    if not isinstance(parsed, dict):  # unreachable: parse_schema returns a dict or a bool
        raise SchemaValidationError("a JSON Schema must be an object or a boolean", path="$")
    out: dict[str, Any] = copied if copied is not None else copy.deepcopy(parsed)
    out.pop("x-guidance", None)  # backend options are ours to set, not the user's
    try:
        # NOTE: the rewrites (and the second check) run only where they have work
        localize_refs(out)
        if rewrite is not None:
            # NOTE: before the keywords are checked: a $ref may reach a subschema in a keyword
            # no draft defines, which the front end would not walk
            hoist_ref_targets(out)
        skip = REWRITABLE | CHECKED if checked else REWRITABLE
        if rewrite is None or check_keywords(out, skip=skip):
            if rewrite is not None:
                out = rewrite(out)
            check_keywords(out)
    except RecursionError:
        raise SchemaValidationError("the schema is nested too deeply", path="$") from None
    return out


def rebase_refs(schema: dict[str, Any], prefix: str) -> dict[str, Any]:
    """A copy of ``schema`` whose local ``$ref``s point under ``prefix`` (a JSON pointer such
    as ``#/$defs/args``), for embedding it inside another schema."""
    out = copy.deepcopy(schema)
    for sub, _ in iter_subschemas(out):
        ref = sub.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            sub["$ref"] = prefix + ref[1:]
    return out
