"""Keywords no grammar can hold, left to run-time value checks (``value_check.ValueCheck``).

The exact rewrites (``rewrite.py``) come first. What they cannot rewrite of ``not``,
``uniqueItems`` (open item domains, or too many arrays to enumerate) and ``contains`` (with
``minContains``/``maxContains``) is offered to :meth:`CheckCollector.take`, which either turns
it into checks or declines (and the keyword is refused as before, with its path):

- the keyword's subschema is reached from the root through *location* steps (``properties``,
  ``items``, ``prefixItems``, ``additionalProperties`` without ``patternProperties``, ``allOf``
  members, and ``$defs`` entries through the ``$ref``s that use them): every value at that
  instance location must satisfy it, whatever else holds;
- below the last location step, the rest of the path may go only through positions where
  dropping a keyword widens the whole (``anyOf``, ``allOf``, ``then``/``else``, ``properties``,
  items, ...), never through ``not``, ``if`` or ``oneOf``. The check then validates the value at
  the location against the subschema there, keyword included;
- every ``$ref`` that check needs resolves inside it (it carries the root's ``$defs``), and no
  ``$ref`` points into what is removed or at a part of the schema used from elsewhere.

The keyword is then removed from the schema the grammar is compiled from (a superset), and the
checks make the pair exact: a value is accepted iff the original schema accepts it.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from grammarserve.fsm.json_schema import iter_subschemas, json_path, resolve_pointer
from grammarserve.fsm.value_check import CheckKind, Step, ValueCheck

#: Keywords the collector may take, and what is removed with each.
CHECKABLE: dict[str, tuple[str, ...]] = {
    "not": ("not",),
    "uniqueItems": ("uniqueItems",),
    "contains": ("contains", "minContains", "maxContains"),
}
#: At most this many checks per schema (more is refused as before).
MAX_CHECKS = 32
#: Path steps below a check's location where removing a keyword only widens the whole.
_MONOTONE = frozenset({"anyOf", "allOf", "properties", "items", "prefixItems",
                       "additionalProperties", "patternProperties", "then", "else",
                       "dependentSchemas", "contains", "propertyNames"})
_NAMED = frozenset({"properties", "patternProperties", "$defs", "definitions",
                    "dependentSchemas", "anyOf", "allOf", "oneOf", "prefixItems"})

Parts = tuple[str | int, ...]
Anchor = tuple[tuple[Step, ...], Parts, bool]  # location, schema path of its node, exact


class CheckCollector:
    """Collects the checks of one schema (``root``, rewritten in place)."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.checks: list[ValueCheck] = []

    def take(self, parts: Parts, keyword: str) -> bool:
        """Turn ``keyword`` of the subschema at ``parts`` into checks and remove it from the
        schema; False (nothing changed) where that would not be exact (see the module
        docstring)."""
        sub = _node(self.root, parts)
        if keyword not in CHECKABLE or not isinstance(sub, dict) or keyword not in sub:
            return False
        target = parts + (keyword,)
        refs = _refs(self.root)
        if any(_starts_with(p, target) for p in refs):
            return False  # a $ref points into what would be removed
        anchors = self._anchors(parts, refs, frozenset())
        if anchors is None or len(self.checks) + len(anchors) > MAX_CHECKS:
            return False
        made = []
        for location, node_parts, exact in anchors:
            check = self._check(location, node_parts, exact and node_parts == parts, sub,
                                keyword, json_path(target))
            if check is None:
                return False
            made.append(check)
        for key in CHECKABLE[keyword]:
            sub.pop(key, None)
        self.checks.extend(made)
        return True

    def _anchors(self, parts: Parts, refs: dict[Parts, list[Parts]], seen: frozenset[Parts]
                 ) -> list[Anchor] | None:
        """The instance locations of the subschema at ``parts``: (location, path of the
        deepest location node, whether the rest below it is empty), or None."""
        segs = _segments(parts)
        for pointer in refs:
            if _starts_with(parts, pointer) and not (
                    len(pointer) == 2 and pointer[0] in ("$defs", "definitions")):
                return None  # reused from elsewhere (a $ref to the root or inside a subschema)
        if segs and segs[0][0] in ("$defs", "definitions"):
            head = segs[0]
            if head in seen:
                return None  # recursive
            out: list[Anchor] = []
            for referrer in refs.get(head, []):
                outer = self._anchors(referrer, refs, seen | {head})
                if outer is None:
                    return None
                for location, node_parts, exact in outer:
                    inner = _walk(self.root, location, head, segs[1:]) if exact else None
                    if inner is not None:
                        out.append(inner)
                    elif all(s[0] in _MONOTONE for s in segs[1:]):
                        out.append((location, node_parts, False))
                    else:
                        return None
            return out
        walked = _walk(self.root, (), (), segs)
        return None if walked is None else [walked]

    def _check(self, location: tuple[Step, ...], node_parts: Parts, exact: bool,
               sub: dict[str, Any], keyword: str, where: str) -> ValueCheck | None:
        kind: CheckKind = "schema"
        schema: Any = _node(self.root, node_parts)
        item: Any = None
        if exact and keyword == "uniqueItems":
            kind, schema = "unique", None
        elif exact and keyword == "contains":
            kind = "contains"
            schema = {k: sub[k] for k in CHECKABLE["contains"] if k in sub}
            item = sub["contains"]
        docs = [self._document(s, node_parts) for s in (schema, item) if s is not None]
        if any(d is None for d in docs):
            return None
        texts = [json.dumps(d, separators=(",", ":"), ensure_ascii=False) for d in docs]
        return ValueCheck(location, kind, keyword, where,
                          schema=texts[0] if schema is not None else "",
                          item_schema=texts[-1] if item is not None else "")

    def _document(self, schema: Any, node_parts: Parts) -> Any:
        """``schema`` as a document of its own (the root's ``$defs`` beside it), or None if one
        of its ``$ref``s would not resolve there."""
        if not node_parts and schema is self.root:
            doc = copy.deepcopy(self.root)
            doc.pop("$schema", None)
        else:
            doc = {"allOf": [copy.deepcopy(schema)]}
            for key in ("$defs", "definitions"):
                if isinstance(self.root.get(key), dict):
                    doc[key] = copy.deepcopy(self.root[key])
        for sub, _ in iter_subschemas(doc):
            ref = sub.get("$ref")
            if ref is None:
                continue
            if not isinstance(ref, str) or not ref.startswith("#"):
                return None
            try:
                resolve_pointer(doc, ref)
            except (KeyError, IndexError, ValueError):
                return None
        return doc


def _walk(root: dict[str, Any], location: tuple[Step, ...], base: Parts,
          segs: list[Parts]) -> Anchor | None:
    """Follow ``segs`` from the node at ``base`` (at instance ``location``) through location
    steps; the rest must be monotone."""
    loc = list(location)
    node_parts = base
    for i, seg in enumerate(segs):
        node = _node(root, node_parts)
        step = _location_step(node, seg)
        if step is None:
            rest = segs[i:]
            if not all(s[0] in _MONOTONE for s in rest):
                return None
            return tuple(loc), node_parts, False
        if step != ("same", None):
            loc.append(step)
        node_parts = node_parts + seg
    return tuple(loc), node_parts, True


def _location_step(node: Any, seg: Parts) -> Step | None:
    if not isinstance(node, dict):
        return None
    key = seg[0]
    if key == "properties":
        return ("key", seg[1])
    if key == "prefixItems":
        return ("index", seg[1])
    if key == "items":
        prefix = node.get("prefixItems")
        return ("from", len(prefix) if isinstance(prefix, list) else 0)
    if key == "additionalProperties" and "patternProperties" not in node:
        return ("other", tuple(node.get("properties") or {}))
    if key == "allOf":
        return ("same", None)
    return None


def _segments(parts: Parts) -> list[Parts]:
    """``("properties", "a", "items")`` -> ``[("properties", "a"), ("items",)]``."""
    out: list[Parts] = []
    i = 0
    while i < len(parts):
        key = parts[i]
        take = 2 if key in _NAMED and i + 1 < len(parts) else 1
        out.append(tuple(parts[i:i + take]))
        i += take
    return out


def _refs(root: dict[str, Any]) -> dict[Parts, list[Parts]]:
    """Every local ``$ref`` of ``root``: the pointed path -> the paths of the referrers."""
    out: dict[Parts, list[Parts]] = {}
    for sub, parts in iter_subschemas(root):
        ref = sub.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            out.setdefault(_pointer_parts(ref), []).append(parts)
    return out


def _pointer_parts(ref: str) -> Parts:
    from urllib.parse import unquote

    body = ref[1:].strip("/")
    if not body:
        return ()
    return tuple(unquote(raw).replace("~1", "/").replace("~0", "~") for raw in body.split("/"))


def _starts_with(parts: Parts, prefix: Parts) -> bool:
    return len(parts) >= len(prefix) and all(
        str(a) == str(b) for a, b in zip(parts, prefix))


def _node(root: Any, parts: Parts) -> Any:
    node = root
    for p in parts:
        node = node[p]
    return node
