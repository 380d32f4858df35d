"""``$ref``s that name a place in the same document by URI (``$id``-relative, anchors) made
into JSON pointers from the root, with the ``referencing`` library that ``jsonschema`` uses.

``{"$id": "https://x/root.json", "$defs": {"a": {"$id": "a.json", "$defs": {"n":
{"$anchor": "n", ...}}}}, "$ref": "a.json#n"}`` becomes ``"$ref": "#/$defs/a/$defs/n"``. Every
``$ref`` is resolved against the base URI in force where it is written (embedded resources
change it), in the terms of the schema's draft (draft-04 ``id``, draft-06/07 fragment-only
``$id`` anchors, ``$id`` ignored beside ``$ref`` before 2019-09). The result means exactly
the same: each reference names the same subschema. Then the embedded ``$id``s and the
``$anchor``s say nothing any more and are removed.

- 2020-12 ``$dynamicRef`` is a plain ``$ref`` when no two ``$dynamicAnchor``s share a name
  (its dynamic resolution can then only find the subschema ``$ref`` finds), and
  ``$dynamicAnchor`` then is a plain anchor; else ``schema/read/dynamicrefs.py`` resolves it statically
  (one copy of a subschema per dynamic scope it is evaluated in).
- References that resolve to no place in the document (remote ones) are left as written, for
  the front end to refuse; so are references into the JSON Schema meta-schemas
  (``schema/read/metaschemas.py`` bundles those).
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from typing import Any
from urllib.parse import urldefrag, urljoin

from grammarserve.fsm.failures import FAILURES, Failure
from grammarserve.fsm.schema.read.dynamicrefs import plan_dynamic_refs, specialize_dynamic_refs
from grammarserve.fsm.schema.read.metaschemas import is_meta_ref
from grammarserve.fsm.schema.tree import (
    POSITIONS_2020,
    RESTRUCTURED,
    Parts,
    Shape,
    children,
    copy_json,
    iter_any_draft,
    iter_refs,
    move_refs,
    pointer,
    pointer_parts,
    resolve_pointer,
)

log = logging.getLogger(__name__)

_SPECS = {4: "DRAFT4", 6: "DRAFT6", 7: "DRAFT7", 2019: "DRAFT201909", 2020: "DRAFT202012"}


_STATE = {Shape.ONE: "schema", Shape.MAP: "map", Shape.LIST: "list"}


def _unstable(steps: tuple[str, ...]) -> bool:
    """Whether a pointer goes below a keyword the rewrites restructure, or through a place
    that is no subschema position (a keyword no draft defines, used as a container)."""
    state = "schema"
    for step in steps:
        if state == "schema":
            if step in RESTRUCTURED:
                return True
            shape = POSITIONS_2020.get(step)
            state = "other" if shape is None else _STATE[shape]
            if state == "other":
                return True
        else:
            state = "schema"
    return False


def hoist_ref_targets(schema: dict[str, Any]) -> dict[str, Any]:
    """Copy every subschema a ``$ref`` points at from below a keyword the rewrites may
    restructure (``"$ref": "#/if"``, ``#/properties/a/not``) or from a keyword no draft
    defines (``#/definitions/v3/task``) into ``$defs`` and point the references there (in
    place; the copy is the same subschema, its pointers absolute). Then every subschema a
    ``$ref`` reaches lies where the front end walks."""
    targets: dict[tuple[str, ...], None] = {}
    for sub, _ in iter_refs(schema):
        ref = sub["$ref"]
        if ref.startswith("#") and _unstable(pointer_parts(ref)):
            targets[pointer_parts(ref)] = None
    if not targets:
        return schema

    defs = schema.setdefault("$defs", {})
    for n, steps in enumerate(sorted(targets, key=len, reverse=True)):
        try:
            target = resolve_pointer(schema, pointer(steps))
        except (KeyError, IndexError, ValueError):
            continue  # dangling: the front end says so
        name = f"hoisted_{n}"
        while name in defs:
            name += "_"
        defs[name] = copy_json(target, depth=10_000)
        move_refs(schema, steps, ("$defs", name))
    return schema


def needs_localizing(schema: dict[str, Any], draft: int = 2020) -> bool:
    """True if some ``$ref`` is not a plain pointer from the root, or some subschema below the
    root changes the base URI or names an anchor."""
    for node, parts in iter_any_draft(schema):
        ref = node.get("$ref")
        if isinstance(ref, str) and not (ref == "#" or ref.startswith("#/")):
            return True
        if "$dynamicRef" in node or "$anchor" in node or "$dynamicAnchor" in node:
            return True
        if parts and ("$id" in node or (draft == 4 and isinstance(node.get("id"), str))):
            return True
    return False


def localize_refs(schema: dict[str, Any], draft: int = 2020) -> dict[str, Any]:
    """Rewrite the references of ``schema`` (in place) as the module docstring says; return
    it."""
    if not needs_localizing(schema, draft):
        return schema
    from referencing import Registry
    from referencing import jsonschema as specs
    from referencing.exceptions import Unresolvable

    spec = getattr(specs, _SPECS[draft])
    if draft == 2020:
        _plain_dynamic_refs(schema)
    try:
        registry = Registry().with_resource("", spec.create_resource(schema)).crawl()
    except Exception as e:  # noqa: BLE001 - ids it cannot read: leave the refs to the front end
        FAILURES.report(Failure.LOCAL_REFS, log, logging.INFO, "a schema's ids could not be "
                        "read (%s: %s); its references are left to the front end, which "
                        "refuses those it cannot follow", type(e).__name__, e)
        return schema

    paths: dict[int, Parts] = {}
    bases: list[tuple[dict[str, Any], str]] = []
    stack: list[tuple[dict[str, Any], Parts, str]] = [(schema, (), "")]
    while stack:
        node, parts, parent = stack.pop()
        own = spec.id_of(node)
        base = urldefrag(urljoin(parent, own))[0] if own else parent
        paths[id(node)] = parts
        bases.append((node, base))
        stack.extend((child, where, base) for child, where in children(node, parts))
    root_base = bases[0][1]
    plan = None
    if draft == 2020 and any("$dynamicRef" in node for node, _ in bases):
        plan = plan_dynamic_refs(schema, {id(n): b for n, b in bases},
                                 functools.partial(_locate, registry, paths))
    for node, base in bases:
        ref = node.get("$ref")
        if not isinstance(ref, str) or is_meta_ref(ref):
            continue
        if base == root_base and (ref == "#" or ref.startswith("#/")):
            continue
        try:
            target = _resolve(registry, base, ref, paths)
        except (Unresolvable, KeyError, IndexError, ValueError):
            continue  # not in this document: the front end refuses it
        if target is not None:
            node["$ref"] = pointer(target)
    if plan is not None:
        specialize_dynamic_refs(schema, plan)
    _strip(schema, draft)
    return schema


def _locate(registry: Any, paths: dict[int, Parts], base: str,
            ref: str) -> tuple[str, ...] | None:
    """For ``dynamicrefs``: the path of ``ref``'s target (None: not in this document, or in a
    meta-schema)."""
    from referencing.exceptions import Unresolvable


    if is_meta_ref(ref):
        return None
    try:
        target = _resolve(registry, base, ref, paths)
    except (Unresolvable, KeyError, IndexError, ValueError):
        return None
    return None if target is None else tuple(map(str, target))


def _resolve(registry: Any, base: str, ref: str, paths: dict[int, Parts]) -> Parts | None:
    """The path from the root of the subschema ``ref`` names (written where ``base`` holds)."""
    uri, fragment = urldefrag(urljoin(base, ref))
    resolver = registry.resolver(base_uri=base)
    resource = resolver.lookup(uri).contents
    if id(resource) not in paths:
        return None
    if fragment and not fragment.startswith("/"):
        found = resolver.lookup(f"{uri}#{fragment}").contents
        return paths.get(id(found))
    parts = paths[id(resource)] + pointer_parts("#" + fragment)

    root_path = pointer(parts)
    resolve_pointer(_root_of(registry), root_path)  # raises if it does not resolve
    return parts


def _root_of(registry: Any) -> Any:
    return registry.contents("")


def _plain_dynamic_refs(schema: dict[str, Any]) -> None:
    """``$dynamicRef`` -> ``$ref`` where no two ``$dynamicAnchor``s share a name (in place)."""
    nodes = list(iter_any_draft(schema))
    names = Counter(n["$dynamicAnchor"] for n, _ in nodes if "$dynamicAnchor" in n)
    if any(count > 1 for count in names.values()):
        return
    for node, _ in nodes:
        ref = node.pop("$dynamicRef", None)
        if ref is None:
            continue
        if "$ref" in node:
            node.setdefault("allOf", []).append({"$ref": ref})
        else:
            node["$ref"] = ref


def _binds_meta(nodes: list[tuple[dict[str, Any], Parts]]) -> bool:
    """Whether the schema sets ``$dynamicAnchor: "meta"`` and refers to a Draft 2020-12
    meta-schema: that anchor would then bind the meta-schema's ``$dynamicRef: "#meta"``,
    which ``schema/read/metaschemas.py`` resolves as if it did not (so the anchor stays, and is refused)."""

    return any(n.get("$dynamicAnchor") == "meta" for n, _ in nodes) and any(
        is_meta_ref(n.get("$ref")) and "/draft/2020-12/" in n["$ref"] for n, _ in nodes)


def _strip(schema: dict[str, Any], draft: int) -> None:
    """Drop what only named places (embedded ``$id``s, anchors) once every reference that
    resolves is a pointer; ``$dynamicAnchor``s stay while a ``$dynamicRef`` needs them (or
    one named ``meta`` could bind a meta-schema's, ``_binds_meta``)."""
    nodes = list(iter_any_draft(schema))
    dynamic = any("$dynamicRef" in n for n, _ in nodes) or _binds_meta(nodes)
    for node, parts in nodes:
        node.pop("$anchor", None)
        if not dynamic:
            node.pop("$dynamicAnchor", None)
        if not parts:
            continue
        if isinstance(node.get("$id"), str):
            del node["$id"]
        if draft == 4 and isinstance(node.get("id"), str):
            del node["id"]
