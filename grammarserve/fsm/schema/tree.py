"""The ground floor of the JSON-Schema front end: where a schema holds subschemas (the one
keyword table), walkers over them, JSON paths for messages, JSON pointers, fast copies and
moving local ``$ref``s. Everything above imports this; this imports nothing of the wing."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from enum import Enum
from typing import Any
from urllib.parse import quote, unquote

Parts = tuple[str | int, ...]


class Shape(Enum):
    """What a subschema keyword's value is."""

    ONE = 0  # one subschema
    MAP = 1  # a map of names to subschemas
    LIST = 2  # a list of subschemas


#: Every keyword that holds subschemas in some draft from 4 to 2020-12, in the order the front
#: end walks them, with the shapes its value may take (``items`` is a list in drafts 4-2019).
SUBSCHEMA_KEYWORDS: dict[str, tuple[Shape, ...]] = {
    "items": (Shape.ONE, Shape.LIST), "additionalProperties": (Shape.ONE,),
    "contains": (Shape.ONE,), "not": (Shape.ONE,), "if": (Shape.ONE,), "then": (Shape.ONE,),
    "else": (Shape.ONE,), "propertyNames": (Shape.ONE,), "unevaluatedItems": (Shape.ONE,),
    "unevaluatedProperties": (Shape.ONE,), "additionalItems": (Shape.ONE,),
    "contentSchema": (Shape.ONE,),
    "properties": (Shape.MAP,), "patternProperties": (Shape.MAP,), "$defs": (Shape.MAP,),
    "definitions": (Shape.MAP,), "dependentSchemas": (Shape.MAP,), "dependencies": (Shape.MAP,),
    "allOf": (Shape.LIST,), "anyOf": (Shape.LIST,), "oneOf": (Shape.LIST,),
    "prefixItems": (Shape.LIST,),
}
#: Shapes only drafts before 2020-12 give (translated away by ``read/drafts.py``).
OLDER_DRAFTS: frozenset[tuple[str, Shape]] = frozenset({
    ("items", Shape.LIST), ("dependencies", Shape.MAP), ("additionalItems", Shape.ONE)})
#: Subschemas that assert nothing (the content vocabulary's annotation): not walked for
#: keywords to check or rewrite, but a ``$ref`` may still point into one.
ANNOTATIONS = frozenset({"contentSchema"})

#: Keywords the front end's exact rewrites (``rewrites.py``) may remove; refused where they
#: cannot (``keywords.py``).
REWRITABLE = frozenset({"not", "if", "dependentRequired", "dependentSchemas", "uniqueItems",
                        "unevaluatedProperties", "unevaluatedItems"})
#: What the rewrites may also hand to run-time value checks (``checks/``).
CHECKED = frozenset({"contains"})
#: Keywords whose subschemas the rewrites restructure or remove: a ``$ref`` must not point
#: below one (``read/localrefs.py``).
RESTRUCTURED = REWRITABLE | CHECKED | frozenset({
    "then", "else", "oneOf", "propertyNames", "patternProperties", "dependencies",
    "additionalItems"})
#: Keywords that make the rewrites worth running (some are removed without being refused).
REWRITE_TRIGGERS = (RESTRUCTURED - {"additionalItems"}) | frozenset({
    "minProperties", "maxProperties", "pattern"})

#: Draft 2020-12's subschema positions (``$ref`` targets are judged by them).
POSITIONS_2020: dict[str, Shape] = {
    k: s for k, shapes in SUBSCHEMA_KEYWORDS.items() for s in shapes if (k, s) not in OLDER_DRAFTS}
#: The front end's walk (``iter_subschemas``): 2020-12's asserting positions, and
#: ``additionalItems``: a 2020-12 schema that still writes it has its subschema checked too.
_SHAPE: dict[str, Shape] = {k: s for k, s in POSITIONS_2020.items() if k not in ANNOTATIONS}
_SHAPE["additionalItems"] = Shape.ONE
_SHAPE = {k: _SHAPE[k] for k in SUBSCHEMA_KEYWORDS if k in _SHAPE}  # NOTE: in table order
_ORDER = {k: i for i, k in enumerate(_SHAPE)}
_WALK_KEYS = frozenset(_SHAPE)
_ANY_KEYS = frozenset(SUBSCHEMA_KEYWORDS)


def json_path(parts: Parts) -> str:
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


def iter_subschemas(schema: Any, path: Parts = ()) -> Iterator[tuple[dict[str, Any], Parts]]:
    """Yield every object subschema of a Draft 2020-12 schema with its path (depth-first,
    schema positions only, so ``enum``/``const``/``default`` values are never mistaken for
    schemas).

    NOTE: one explicit stack, not nested generators (a ``yield from`` chain costs every item
    one step per level above it), and nodes without schema keywords are skipped with one set
    test: the front end walks each schema many times. A node's children (its schema keywords
    in table order, each one's members in order) are pushed in reverse, so they come off
    the stack in order; they are read after the node is yielded, so a caller may still
    rewrite them first."""
    if not isinstance(schema, dict):
        return
    stack: list[tuple[dict[str, Any], Parts]] = [(schema, path)]
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
            if shape is Shape.ONE:
                if isinstance(value, dict):
                    push((value, where + (key,)))
            elif shape is Shape.MAP:
                if isinstance(value, dict):
                    for name, sub in reversed(value.items()):
                        if isinstance(sub, dict):
                            push((sub, where + (key, name)))
            elif isinstance(value, list):
                for i in range(len(value) - 1, -1, -1):
                    sub = value[i]
                    if isinstance(sub, dict):
                        push((sub, where + (key, i)))


def children(node: dict[str, Any], where: Parts) -> list[tuple[dict[str, Any], Parts]]:
    """The direct object subschemas of ``node`` (at ``where``) in any draft from 4 to 2020-12
    (annotations included), with their paths, in table order."""
    out: list[tuple[dict[str, Any], Parts]] = []
    if _ANY_KEYS.isdisjoint(node):
        return out
    for key, shapes in SUBSCHEMA_KEYWORDS.items():
        value = node.get(key)
        if isinstance(value, dict):
            if Shape.ONE in shapes:
                out.append((value, where + (key,)))
            elif Shape.MAP in shapes:
                out.extend((v, where + (key, k)) for k, v in value.items()
                           if isinstance(v, dict))
        elif isinstance(value, list) and Shape.LIST in shapes:
            out.extend((v, where + (key, i)) for i, v in enumerate(value)
                       if isinstance(v, dict))
    return out


def iter_any_draft(schema: Any, path: Parts = ()) -> Iterator[tuple[dict[str, Any], Parts]]:
    """Every object subschema of a draft 4 to 2020-12 schema with its path (pre-order)."""
    if not isinstance(schema, dict):
        return
    stack: list[tuple[dict[str, Any], Parts]] = [(schema, path)]
    while stack:
        node, where = stack.pop()
        yield node, where
        stack.extend(reversed(children(node, where)))


#: Schemas nested deeper (JSON levels) are meta-validated by ``jsonschema`` alone: its verdict
#: there depends on Python's recursion limit ("nested too deeply"), and ``jsonschema_rs``'s
#: native recursion could overflow the stack.
FAST_MAX_DEPTH = 200


class TooDeep(Exception):
    """A document nested past the depth ``copy_json`` was given."""


def copy_json(node: Any, depth: int = FAST_MAX_DEPTH) -> Any:
    """A deep copy of a JSON document (dicts and lists copied, leaves shared: they are
    immutable), ~10x faster than ``copy.deepcopy``; raises ``TooDeep`` past ``depth`` levels."""
    if depth <= 0:
        raise TooDeep
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


#: Characters a pointer step keeps unescaped (RFC 3986 ``pchar`` minus ``%``): backends that
#: do not percent-decode pointers (llguidance) still find ``$defs`` names.
_SAFE = "!$&'()*+,;=:@-._~"


def pointer(parts: Parts) -> str:
    """``("$defs", "a b")`` -> ``#/$defs/a%20b`` (JSON pointer escapes, then URI escapes)."""
    return "#" + "".join(
        "/" + quote(str(p).replace("~", "~0").replace("/", "~1"), safe=_SAFE) for p in parts)


def pointer_parts(ref: str) -> tuple[str, ...]:
    """The steps of a local pointer reference (``#/a/b`` -> ``("a", "b")``)."""
    body = ref[1:]
    if body in ("", "/"):
        return ()
    return tuple(unquote(raw).replace("~1", "/").replace("~0", "~")
                 for raw in body.split("/")[1:])


#: Keywords whose values are data, not schemas: a ``"$ref"`` key inside is a value.
_DATA = frozenset({"enum", "const", "default", "examples"})


def iter_refs(doc: Any) -> Iterator[tuple[dict[str, Any], Parts]]:
    """Every object of ``doc`` holding a string ``$ref`` with its path, wherever it is (also
    inside keywords no draft defines, which ``$ref``s may still point into), except in data
    (``enum``, ``const``, ``default``, ``examples``)."""
    stack: list[tuple[Any, Parts]] = [(doc, ())]
    while stack:
        node, parts = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                yield node, parts
            stack.extend((v, parts + (k,)) for k, v in node.items()
                         if k not in _DATA and isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend((v, parts + (i,)) for i, v in enumerate(node)
                         if isinstance(v, (dict, list)))


def move_refs(root: dict[str, Any], old: Parts, new: Parts) -> None:
    """Point the local ``$ref``s at or below the subschema at ``old`` at ``new`` instead (in
    place): it moved."""
    prefix = tuple(str(p) for p in old)
    for sub, _ in iter_refs(root):
        ref = sub["$ref"]
        if ref.startswith("#"):
            steps = pointer_parts(ref)
            if steps[:len(prefix)] == prefix:
                sub["$ref"] = pointer(tuple(new) + steps[len(prefix):])


def rebase_refs(schema: dict[str, Any], prefix: str) -> dict[str, Any]:
    """A copy of ``schema`` whose local ``$ref``s point under ``prefix`` (a JSON pointer such
    as ``#/$defs/args``), for embedding it inside another schema."""
    out = copy.deepcopy(schema)
    for sub, _ in iter_subschemas(out):
        ref = sub.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            sub["$ref"] = prefix + ref[1:]
    return out
