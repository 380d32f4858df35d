"""Keywords no grammar can hold, left to run-time value checks (``value_check.ValueCheck``).

The exact rewrites (``schema/rewrites.py``) come first. What they cannot rewrite is offered to
:meth:`CheckCollector.take` (``schema/checks/plan.py`` says which keywords, and when), which either
turns it into checks or declines (and the keyword is refused as before, with its path):

- the keyword's subschema is reached from the root through *location* steps (``properties``,
  ``items``, ``prefixItems``, ``additionalProperties`` without ``patternProperties``, ``allOf``
  members, and every ``$ref`` to it or to a subschema holding it, from wherever that ``$ref``
  is reached): every value at that instance location must satisfy it, whatever else holds;
- below the last location step, the rest of the path may go only through positions where
  dropping a keyword widens the whole (``anyOf``, ``allOf``, ``then``/``else``, ``properties``,
  items, ...), never through ``not``, ``if`` or ``oneOf``. The check then validates the value at
  the location against the subschema there, keyword included;
- a recursion (the subschema holds a ``$ref`` back to itself, at any depth) is checked whole
  where it is entered from outside, if the way around it is monotone;
- every ``$ref`` that check needs resolves inside it (it carries the root's ``$defs``, or the
  whole root when it refers elsewhere in it), and no ``$ref`` points into what is removed.

The keyword is then removed from the schema the grammar is compiled from (a superset: ``oneOf``
becomes ``anyOf``, overlapping ``patternProperties`` fold into ``additionalProperties``, a
``pattern`` becomes its superset without look-around or back-references), and
the checks make the pair exact: a value is accepted iff the original schema accepts it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from grammarserve.fsm.regex_superset import superset
from grammarserve.fsm.schema.checks.paths import (
    Anchor,
    Parts,
    monotone_below,
    node_at,
    segments,
    starts_with,
    text_prefixes,
    walk_to_location,
)
from grammarserve.fsm.schema.tree import (
    copy_json,
    iter_refs,
    iter_subschemas,
    json_path,
    move_refs,
    pointer,
    pointer_parts,
    rebase_refs,
    resolve_pointer,
)
from grammarserve.fsm.value_check import CheckKind, Step, ValueCheck

#: Keywords the collector may take, and what is removed with each (each only asserts: removing
#: it changes no other keyword's meaning, once ``unevaluated*`` are gone from the grammar).
#: ``oneOf`` is not removed but becomes ``anyOf`` (at least one branch; the check says exactly
#: one).
CHECKABLE: dict[str, tuple[str, ...]] = {
    "not": ("not",),
    "uniqueItems": ("uniqueItems",),
    "contains": ("contains", "minContains", "maxContains"),
    "unevaluatedProperties": ("unevaluatedProperties",),
    "unevaluatedItems": ("unevaluatedItems",),
    "propertyNames": ("propertyNames",),
    "minProperties": ("minProperties", "maxProperties"),
    "maxProperties": ("minProperties", "maxProperties"),
    "pattern": ("pattern",),
    "oneOf": ("oneOf",),
    "if": ("if", "then", "else"),
    "dependentRequired": ("dependentRequired",),
    "dependentSchemas": ("dependentSchemas",),
    "patternProperties": ("patternProperties",),
}
#: At most this many checks per schema (more is refused as before).
MAX_CHECKS = 1024
#: Keywords that assert nothing, left out of the checks' documents.
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment",
                          "deprecated", "readOnly", "writeOnly"})
#: Keywords whose subschemas apply to (a part of) the value (``$defs``, unknown keywords and
#: ``contentSchema`` hold subschemas that apply only where a ``$ref`` uses them).
_APPLIED = frozenset({"properties", "patternProperties", "additionalProperties", "items",
                      "prefixItems", "contains", "allOf", "anyOf", "oneOf", "not", "if", "then",
                      "else", "dependentSchemas", "propertyNames", "unevaluatedItems",
                      "unevaluatedProperties"})



class CheckCollector:
    """Collects the checks of one schema (``root``, rewritten in place)."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.checks: list[ValueCheck] = []
        self._recursive: set[Parts] = set()  # targets met again while finding anchors
        self._widening: Parts | None = None  # the oneOf being taken: it will be an anyOf
        self._ref_cache: dict[Parts, list[Parts]] | None = None
        self._holders: list[tuple[dict[str, Any], Parts, Parts]] = []  # node, path, target
        self._batch = False
        # NOTE: the documents of one take, by (subschema, its path): a subschema reached from
        # many locations (a $defs entry used in many places) is one document, built once.
        self._docs: dict[tuple[int, Parts], str | None] = {}
        self._plain: dict[int, str | None] = {}  # subschema of the root -> plain document

    def take(self, parts: Parts, keyword: str) -> bool:
        """Turn ``keyword`` of the subschema at ``parts`` into checks and remove it from the
        schema; False (nothing changed) where that would not be exact (see the module
        docstring)."""
        sub = node_at(self.root, parts)
        if keyword not in CHECKABLE or not isinstance(sub, dict) or keyword not in sub:
            return False
        target = parts + (keyword,)
        refs = self._refs()
        moved = [k for k in CHECKABLE[keyword] if k in sub and k != "oneOf"]
        if keyword == "patternProperties" and "additionalProperties" in sub:
            moved.append("additionalProperties")
        if any(starts_with(p, parts + (k,)) for p in refs for k in moved):
            return False  # a $ref points into what would be removed
        self._recursive = set()
        self._widening = target if keyword == "oneOf" else None
        anchors = self._anchors(parts, refs, frozenset())
        if anchors is None or len(self.checks) + len(anchors) > MAX_CHECKS:
            return False
        made = []
        self._docs, self._plain = {}, {}
        for location, node_parts, exact in anchors:
            check = self._check(location, node_parts, exact and node_parts == parts, sub,
                                keyword, json_path(target))
            if check is None:
                return False
            made.append(check)
        self._widen(sub, parts, keyword)
        self.checks.extend(made)
        return True

    def _widen(self, sub: dict[str, Any], parts: Parts, keyword: str) -> None:
        """Remove ``keyword`` from ``sub`` (at ``parts``), leaving a superset: ``oneOf``
        becomes ``anyOf`` (``$ref``s into it follow), ``patternProperties`` folds into
        ``additionalProperties`` when that is there (every other member satisfies it or one of
        the patterns' schemas)."""
        if keyword == "oneOf":
            branches = sub.pop("oneOf")
            if "anyOf" in sub:
                sub.setdefault("allOf", []).append({"anyOf": branches})
                moved_to = parts + ("allOf", len(sub["allOf"]) - 1, "anyOf")
            else:
                sub["anyOf"] = branches
                moved_to = parts + ("anyOf",)
            self.rename(parts + ("oneOf",), moved_to)
            return
        if keyword == "patternProperties":
            schemas = list(sub.pop("patternProperties").values())
            self.moved()
            if "additionalProperties" in sub:
                options = [o for o in [sub["additionalProperties"], *schemas] if o is not False]
                if any(o is True or o == {} for o in options):
                    sub["additionalProperties"] = True
                elif options:
                    sub["additionalProperties"] = options[0] if len(options) == 1 \
                        else {"anyOf": options}
            return
        if keyword == "pattern":
            wider = superset(sub["pattern"])
            if wider:
                sub["pattern"] = wider  # the check holds the exact pattern
            else:
                del sub["pattern"]  # nothing is left to hold ("(?=\\d)")
            return
        for key in CHECKABLE[keyword]:
            sub.pop(key, None)

    def _anchors(self, parts: Parts, refs: dict[Parts, list[Parts]], seen: frozenset[Parts]
                 ) -> list[Anchor] | None:
        """The instance locations of the subschema at ``parts``: (location, path of the
        deepest location node, whether the rest below it is empty), or None.

        It is reached through every *target* that holds it: the root (the document itself)
        and each ``$ref`` target, from wherever that ``$ref`` is reached, unless the way from
        there goes through a keyword that applies nothing (``$defs``, an unknown keyword).
        Through a recursion (a target met again while its referrers are followed) a value
        holds further values of the same subschema at any depth: the occurrences inside are
        then covered by checking the whole value where the recursion is entered from outside
        (``_recursive``), if the way down is monotone."""
        out: list[Anchor] = []
        pointers = list(refs.items())
        if () not in refs:
            pointers.append(((), []))
        # NOTE: the targets are text paths (``pointer_parts``), so a set lookup stands for
        # ``starts_with(parts, target)`` (this loop runs for every referrer, recursively).
        prefixes = text_prefixes(parts)
        for target, referrers in pointers:
            if target not in prefixes:
                continue
            rest = segments(parts[len(target):])
            if any(s[0] not in _APPLIED for s in rest):
                continue  # not applied to the value from there (in $defs, an unknown keyword)
            monotone = monotone_below(target, rest, self._widening)
            if target in seen:
                if not monotone:
                    return None
                self._recursive.add(target)
                continue  # covered where the recursion is entered
            hits = len(self._recursive)
            outers: list[Anchor] = [((), (), True)] if target == () else []
            for referrer in referrers:
                outer = self._anchors(referrer, refs, seen | {target})
                if outer is None:
                    return None
                outers.extend(outer)
            if len(self._recursive) > hits and not monotone:
                return None
            whole = target in self._recursive
            for location, node_parts, exact in outers:
                inner = walk_to_location(self.root, location, target, rest, self._widening) \
                    if exact and not whole else None
                if inner is not None:
                    out.append(inner)
                elif monotone:
                    out.append((location, node_parts, False))
                else:
                    return None
            if len(out) > MAX_CHECKS:
                return None
        return list(dict.fromkeys(out))

    def _check(self, location: tuple[Step, ...], node_parts: Parts, exact: bool,
               sub: dict[str, Any], keyword: str, where: str) -> ValueCheck | None:
        kind: CheckKind = "schema"
        schema: Any = node_at(self.root, node_parts)
        item: Any = None
        if exact and keyword == "uniqueItems":
            kind, schema = "unique", None
        elif exact and keyword == "contains":
            kind = "contains"
            schema = {k: sub[k] for k in CHECKABLE["contains"] if k in sub}
            item = sub["contains"]
        texts = [self._text(s, node_parts if kind == "schema" else None)
                 for s in (schema, item) if s is not None]
        if any(t is None for t in texts):
            return None
        return ValueCheck(location, kind, keyword, where,
                          schema=texts[0] or "" if schema is not None else "",
                          item_schema=texts[-1] or "" if item is not None else "")

    def _text(self, schema: Any, node_parts: Parts | None) -> str | None:
        """The JSON text of ``_document(schema, node_parts)`` (built once per take for a
        subschema of the root, ``node_parts`` given)."""
        if node_parts:
            # NOTE: a subschema of the root reached from many places (a $defs entry) has one
            # plain document (it and the $defs entries it uses), whatever its path: built
            # once per take; only a subschema whose $refs do not resolve there needs its path
            if id(schema) not in self._plain:
                doc = self._plain_document(schema)
                self._plain[id(schema)] = None if doc is None else json.dumps(
                    doc, separators=(",", ":"), ensure_ascii=False)
            plain = self._plain[id(schema)]
            if plain is not None:
                return plain
        key = (id(schema), node_parts) if node_parts is not None else None
        if key is not None and key in self._docs:
            return self._docs[key]
        doc = self._document(schema, node_parts)
        text = None if doc is None else json.dumps(doc, separators=(",", ":"),
                                                   ensure_ascii=False)
        if key is not None:
            self._docs[key] = text
        return text

    def _document(self, schema: Any, node_parts: Parts | None) -> Any:
        """``schema`` as a document of its own (with the root's ``$defs`` entries it uses), or
        None if one of its ``$ref``s would not resolve there. Where the subschema is the
        root's at ``node_parts`` and it refers elsewhere in the root (``#/properties/...``),
        the document holds the whole root and refers to it there. Annotations are left out
        (``jsonschema_rs`` refuses some that the meta-schema lets through)."""
        if not node_parts and schema is self.root:
            doc = copy_json(self.root, depth=10_000)
            doc.pop("$schema", None)
            if _resolves(doc):
                return _without_annotations(doc)
        else:
            plain = self._plain_document(schema)
            if plain is not None:
                return plain
        if node_parts is None:
            return None
        whole = rebase_refs(self.root, "#/$defs/__root")
        whole.pop("$schema", None)
        whole.pop("$id", None)
        doc = {"$ref": "#/$defs/__root" + pointer(node_parts)[1:], "$defs": {"__root": whole}}
        return _without_annotations(doc) if _resolves(doc) else None

    def _plain_document(self, schema: Any) -> Any:
        """``{"allOf": [schema]}`` with the root's ``$defs`` entries it uses, without
        annotations; None if a ``$ref`` of it would not resolve there."""
        doc: dict[str, Any] = {"allOf": [copy_json(schema, depth=10_000)]}
        for container, name in self._defs_used(schema) or ():
            doc.setdefault(container, {})[name] = copy_json(self.root[container][name],
                                                             depth=10_000)
        return _without_annotations(doc) if _resolves(doc) else None

    def _defs_used(self, schema: Any) -> list[tuple[str, str]] | None:
        """The ``$defs``/``definitions`` entries ``schema`` reaches through its ``$ref``s
        (transitively), or None if one points elsewhere."""
        found: dict[tuple[str, str], None] = {}
        todo = [schema]
        while todo:
            for _, target in _ref_targets(todo.pop()):
                if len(target) < 2 or target[0] not in ("$defs", "definitions"):
                    return None
                entry = (str(target[0]), str(target[1]))
                if entry in found:
                    continue
                holder = self.root.get(entry[0])
                if not isinstance(holder, dict) or entry[1] not in holder:
                    return None
                found[entry] = None
                todo.append(holder[entry[1]])
        return list(found)

    def _refs(self) -> dict[Parts, list[Parts]]:
        if self._ref_cache is None or not self._batch:
            self._holders = [(sub, parts, pointer_parts(sub["$ref"]))
                             for sub, parts in iter_refs(self.root)
                             if sub["$ref"].startswith("#")]
            self._ref_cache = self._index()
        return self._ref_cache

    def _index(self) -> dict[Parts, list[Parts]]:
        out: dict[Parts, list[Parts]] = {}
        for _, parts, target in self._holders:
            out.setdefault(target, []).append(parts)
        return out

    def points_into(self, parts: Parts) -> bool:
        """Whether some ``$ref`` points at or below the subschema at ``parts``."""
        return any(starts_with(target, parts) for target in self._refs())

    def rename(self, old: Parts, new: Parts) -> None:
        """The subschema at ``old`` is now at ``new``: its ``$ref``s follow (and, in a batch,
        the cached referrers, instead of another walk over the whole document)."""
        if not self._batch:
            move_refs(self.root, old, new)
            return
        self._refs()

        def moved(path: Parts) -> Parts:
            return new + path[len(old):] if starts_with(path, old) else path

        holders = []
        for sub, parts, target in self._holders:
            if starts_with(target, old):
                target = tuple(str(p) for p in moved(target))
                sub["$ref"] = pointer(target)
            holders.append((sub, moved(parts), target))
        self._holders = holders
        self._ref_cache = self._index()

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Takes in a row, with nothing but them (and :meth:`moved`) changing the schema: the
        ``$ref``s of the root are found once, not on every take."""
        self._batch, self._ref_cache = True, None
        try:
            yield
        finally:
            self._batch, self._ref_cache = False, None

    def moved(self) -> None:
        """Say that ``$ref``s of the root changed (cached referrers are stale)."""
        self._ref_cache = None


def _ref_targets(node: Any) -> list[tuple[Parts, Parts]]:
    """(referrer path, target path) of every local ``$ref`` in ``node``."""
    return [(parts, pointer_parts(sub["$ref"])) for sub, parts in iter_refs(node)
            if sub["$ref"].startswith("#")]


def _without_annotations(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` without the annotations of its subschemas (in place)."""
    for sub, _ in iter_subschemas(doc):
        for key in _ANNOTATIONS & set(sub):
            del sub[key]
    return doc


def _resolves(doc: dict[str, Any]) -> bool:
    """Whether every ``$ref`` of ``doc`` is a local pointer that resolves in it."""
    for sub, _ in iter_subschemas(doc):
        ref = sub.get("$ref")
        if ref is None:
            continue
        if not isinstance(ref, str) or not ref.startswith("#"):
            return False
        try:
            resolve_pointer(doc, ref)
        except (KeyError, IndexError, ValueError):
            return False
    return True
