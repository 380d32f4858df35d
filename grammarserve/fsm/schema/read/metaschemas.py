"""``$ref``s into the JSON Schema meta-schemas, resolved locally (never fetched).

``"$ref": "http://json-schema.org/draft-07/schema#/definitions/stringArray"`` names a part
of a meta-schema that the ``jsonschema`` package ships (``jsonschema_specifications``: drafts
3, 4, 6, 7, 2019-09, 2020-12). Each part a schema uses (and every part those use in turn) is
copied into ``$defs`` under ``meta_<draft>_<pointer>`` and the reference rewritten to it.
Parts written in an older draft are translated to Draft 2020-12 (``items`` arrays,
``additionalItems``, ``dependencies``, draft-4 boolean ``exclusiveMaximum``); a part that uses
dynamic references is refused. Other remote references are left for the front end to refuse.
"""

from __future__ import annotations

import copy
import functools
import re
from typing import Any
from urllib.parse import urldefrag, urljoin

from grammarserve.errors import UnsupportedSchemaError
from grammarserve.fsm.schema.tree import iter_subschemas, json_path, resolve_pointer


@functools.lru_cache(maxsize=1)
def _registry() -> dict[str, Any]:
    from jsonschema_specifications import REGISTRY

    return {uri.rstrip("#"): REGISTRY.contents(uri) for uri in REGISTRY}


def is_meta_ref(ref: Any) -> bool:
    """True if ``ref`` points into a bundled meta-schema."""
    if not isinstance(ref, str) or ref.startswith("#"):
        return False
    base, _ = urldefrag(ref)
    return _norm(base) in _registry()


def _norm(uri: str) -> str:
    return uri.rstrip("#").replace("http://json-schema.org/draft/", "https://json-schema.org/draft/")


def resolve_meta_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """Bundle the meta-schema parts ``schema`` refers to into its ``$defs`` (in place)."""
    refs = [(sub, parts) for sub, parts in iter_subschemas(schema) if is_meta_ref(sub.get("$ref"))]
    if not refs:
        return schema
    bundler = _Bundler(schema)
    for sub, parts in refs:
        try:
            sub["$ref"] = bundler.local(sub["$ref"])
        except UnsupportedSchemaError as e:
            where = json_path(parts + ("$ref",))
            raise UnsupportedSchemaError(f"$ref {sub['$ref']!r} at {where}: {e}", path=where,
                                         keyword="$ref") from None
    return schema


class _Bundler:
    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.defs = root.setdefault("$defs", {})

    def local(self, ref: str, meta: str | None = None) -> str:
        """The local reference that replaces ``ref`` (copying what it needs).

        ``meta``: the Draft 2020-12 meta-schema resource whose root ``$dynamicRef: "#meta"``
        resolves to. Every 2020-12 meta-schema resource sets ``$dynamicAnchor: "meta"`` at its
        root, so the outermost one entered binds it: the one the schema's own ``$ref`` names
        (the whole meta-schema, or one vocabulary)."""
        base, fragment = urldefrag(ref)
        base = _norm(base)
        pointer = fragment or ""
        if pointer and not pointer.startswith("/"):
            raise UnsupportedSchemaError("anchors in meta-schema references are not supported")
        dynamic = "/draft/2020-12/" in base
        if dynamic and meta is None:
            meta = base
        name = _slug(f"{base}{pointer}")
        if dynamic and meta != base:
            name += "__in_" + _slug(meta or "")
        local = "#/$defs/" + name
        if name in self.defs:
            return local
        doc = _registry()[base]
        try:
            part = resolve_pointer(doc, "#" + pointer)
        except (KeyError, ValueError, IndexError):
            raise UnsupportedSchemaError(f"'{pointer}' does not resolve in {base}") from None
        copied = copy.deepcopy(part)
        self.defs[name] = copied  # registered first, so that cycles end here
        if isinstance(copied, dict):
            self.defs[name] = copied = translate_draft(copied, _draft(base))
            for sub, _ in list(iter_subschemas(copied)):
                if dynamic and sub.get("$dynamicRef") == "#meta":
                    del sub["$dynamicRef"]
                    target = self.local(f"{meta}#", meta)
                    if "$ref" in sub:
                        sub.setdefault("allOf", []).append({"$ref": target})
                    else:
                        sub["$ref"] = target
                if "$dynamicRef" in sub or "$recursiveRef" in sub:
                    raise UnsupportedSchemaError("it uses dynamic references")
                for key in ("$id", "id", "$schema", "$dynamicAnchor", "$recursiveAnchor",
                            "$vocabulary"):
                    sub.pop(key, None)
                ref_here = sub.get("$ref")
                if isinstance(ref_here, str) and not ref_here.startswith("#/$defs/meta_"):
                    sub["$ref"] = self.local(urljoin(base, ref_here), meta)
        return local


def _slug(uri: str) -> str:
    return "meta_" + re.sub(r"[^A-Za-z0-9]+", "_",
                            uri.rsplit("json-schema.org/", 1)[-1]).strip("_")


def _draft(base: str) -> int:
    for n in (3, 4, 6, 7):
        if f"draft-0{n}/" in base:
            return n
    return 2020


def translate_draft(part: dict[str, Any], draft: int) -> dict[str, Any]:
    """A draft-``draft`` schema rewritten in Draft 2020-12 terms (in place)."""
    if draft == 3:
        raise UnsupportedSchemaError("draft-03 meta-schemas are not supported")
    if draft >= 2019:
        return part
    for sub, _ in list(_walk_old(part)):
        items = sub.get("items")
        if isinstance(items, list):
            sub["prefixItems"] = sub.pop("items")
            if "additionalItems" in sub:
                sub["items"] = sub.pop("additionalItems")
        sub.pop("additionalItems", None)
        deps = sub.pop("dependencies", None)
        if isinstance(deps, dict):
            required = {k: v for k, v in deps.items() if isinstance(v, list)}
            schemas = {k: v for k, v in deps.items() if not isinstance(v, list)}
            if required:
                sub["dependentRequired"] = required
            if schemas:
                sub["dependentSchemas"] = schemas
        if "definitions" in sub:
            sub["$defs"] = {**sub.pop("definitions"), **sub.get("$defs", {})}
        for bound in ("Maximum", "Minimum"):
            flag = sub.get("exclusive" + bound)
            if isinstance(flag, bool):
                del sub["exclusive" + bound]
                if flag and bound.lower() in sub:
                    sub["exclusive" + bound] = sub.pop(bound.lower())
    return part


def _walk_old(node: Any) -> Any:
    """Every subschema of a draft 4-7 schema (``items`` may be a list, ``dependencies`` may
    hold subschemas)."""
    if not isinstance(node, dict):
        return
    yield node, ()
    for key in ("items", "additionalItems", "additionalProperties", "not", "contains",
                "propertyNames", "if", "then", "else"):
        value = node.get(key)
        if isinstance(value, list):
            for v in value:
                yield from _walk_old(v)
        elif isinstance(value, dict):
            yield from _walk_old(value)
    for key in ("properties", "patternProperties", "definitions", "dependencies"):
        value = node.get(key)
        if isinstance(value, dict):
            for v in value.values():
                yield from _walk_old(v)
    for key in ("allOf", "anyOf", "oneOf"):
        value = node.get(key)
        if isinstance(value, list):
            for v in value:
                yield from _walk_old(v)
