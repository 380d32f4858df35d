"""Draft 2020-12 ``$dynamicRef`` resolved statically: one copy of a subschema per dynamic
scope it can be evaluated in.

A ``$dynamicRef`` whose fragment is a plain name ``N`` and whose initial target (resolved like
``$ref``) carries ``"$dynamicAnchor": N`` ("bookended") resolves, at evaluation time, to the
``$dynamicAnchor: N`` of the *outermost* schema resource in the dynamic scope (the resources
entered on the way from the root) that has one, else to the initial target. Any other
``$dynamicRef`` is a ``$ref``.

The dynamic scope only grows along an evaluation path and the outermost definer wins, so what
decides every bookended ``$dynamicRef`` below a point is a *binding*: for each anchor name, the
anchor of the outermost resource entered so far that defines it. Bindings are finite (names x
anchors), so the schema is rewritten exactly: the root is walked with the root resource's
binding; a ``$ref`` or ``$dynamicRef`` whose target can reach a bookended ``$dynamicRef``
("sensitive") enters the innermost resource holding the target, extends the binding with the anchors of names not yet bound, and is
pointed at ``$defs/dyn_<i>``: a copy of the target specialized to that binding (the root with
the root's binding is ``#``). References to other targets keep their pointer. A subschema with
``$id`` met by descent is a resource entered as well. Inside a copy, ``$defs`` are dropped
(pointers name the originals); the originals of sensitive subschemas are then unreachable and
their ``$dynamicRef``s are made plain ``$ref``s to their initial targets.

This follows the JSON Schema 2020-12 core specification (section 8.2.3.2) and
``referencing``'s ``DynamicAnchor.resolve`` (the last, i.e. outermost, anchor found in the
dynamic scope wins).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urldefrag

from grammarserve.fsm.schema.tree import Parts, children, copy_json, iter_any_draft, pointer

Path = tuple[str, ...]
#: A binding: (anchor name, path of the anchor's subschema), sorted.
Binding = tuple[tuple[str, Path], ...]
#: Resolves a reference written where a base URI holds: the path of its target, or None when
#: the target is not in the document.
Resolver = Callable[[str, str], "Path | None"]

#: Positions not evaluated by descent (``$defs`` are reached only through references).
_NOT_EVALUATED = frozenset({"$defs", "definitions"})
#: Cap on specialized copies: beyond it the schema is left as it is (and refused).
MAX_COPIES = 64


def _key(parts: Parts) -> Path:
    return tuple(str(p) for p in parts)


class _Doc:
    """Paths, resources, anchors and references of one document."""

    def __init__(self, schema: dict[str, Any], bases: dict[int, str]) -> None:
        self.nodes: dict[Path, dict[str, Any]] = {}
        self.base: dict[Path, str] = {}
        self.resource_of: dict[Path, Path] = {}
        self.anchors: dict[Path, dict[str, Path]] = {(): {}}
        self.evaluated_in: dict[Path, Path] = {}  # child -> parent, positions evaluated
        stack: list[tuple[dict[str, Any], Parts, Path]] = [(schema, (), ())]
        while stack:
            node, parts, resource = stack.pop()
            path = _key(parts)
            if parts and isinstance(node.get("$id"), str):
                resource = path
                self.anchors.setdefault(path, {})
            self.nodes[path] = node
            self.base[path] = bases.get(id(node), "")
            self.resource_of[path] = resource
            name = node.get("$dynamicAnchor")
            if isinstance(name, str):
                self.anchors[resource].setdefault(name, path)
            for child, where in children(node, parts):
                if where[len(parts)] not in _NOT_EVALUATED:
                    self.evaluated_in[_key(where)] = path
                stack.append((child, where, resource))
        # (node, keyword) -> target; bookended: node -> anchor name
        self.refs: dict[tuple[Path, str], Path] = {}
        self.bookended: dict[Path, str] = {}

    def resolve_all(self, resolve: Resolver) -> bool:
        """Resolve every ``$ref`` and ``$dynamicRef``; False if a ``$dynamicRef`` does not
        resolve in the document (a ``$ref`` that does not is left as written)."""
        for path, node in self.nodes.items():
            for keyword in ("$ref", "$dynamicRef"):
                ref = node.get(keyword)
                if not isinstance(ref, str):
                    continue
                found = resolve(self.base[path], ref)
                if found is None:
                    if keyword == "$dynamicRef":
                        return False
                    continue
                self.refs[path, keyword] = found
                name = urldefrag(ref)[1]
                target = self.nodes.get(found)
                if (keyword == "$dynamicRef" and name and not name.startswith("/")
                        and target is not None and target.get("$dynamicAnchor") == name):
                    self.bookended[path] = name
        return True

    def sensitive(self) -> set[Path]:
        """Subschemas from which a bookended ``$dynamicRef`` can be reached (by descent other
        than into ``$defs``, and through references)."""
        back: dict[Path, set[Path]] = {}
        for child, parent in self.evaluated_in.items():
            back.setdefault(child, set()).add(parent)
        for (path, _), target in self.refs.items():
            back.setdefault(target, set()).add(path)
        for path, name in self.bookended.items():
            for anchors in self.anchors.values():
                if name in anchors:
                    back.setdefault(anchors[name], set()).add(path)
        out = set(self.bookended)
        todo = list(out)
        while todo:
            for source in back.get(todo.pop(), ()):
                if source not in out:
                    out.add(source)
                    todo.append(source)
        return out


def plan_dynamic_refs(schema: dict[str, Any], bases: dict[int, str],
                      resolve: Resolver) -> _Doc | None:
    """What :func:`specialize_dynamic_refs` needs of ``schema``, taken while its references
    are still as written (``bases`` gives each subschema's base URI by ``id``): None when a
    ``$dynamicRef`` does not resolve in the document."""
    doc = _Doc(schema, bases)
    return doc if doc.resolve_all(resolve) else None


def specialize_dynamic_refs(schema: dict[str, Any], plan: _Doc) -> bool:
    """Rewrite ``schema``'s ``$dynamicRef``s as the module docstring says (in place; its
    ``$ref``s may have been made pointers since ``plan`` was taken). Returns False
    (``schema`` untouched) when the copies would exceed :data:`MAX_COPIES`."""
    try:
        root = _Builder(plan).build()
    except _TooMany:
        return False
    schema.clear()
    schema.update(root)
    return True


class _TooMany(Exception):
    pass


class _Builder:
    """Builds the specialized root and its ``dyn_<i>`` copies."""

    def __init__(self, doc: _Doc) -> None:

        self.doc = doc
        self.copy: Callable[[Any], Any] = lambda v: copy_json(v, depth=10_000)
        self.names = set(doc.bookended.values())
        self.sensitive = doc.sensitive()
        self.copies: dict[tuple[Path, Binding], str] = {}
        self.todo: list[tuple[Path, Binding, str]] = []
        self.root_binding = self.extend((), [()])

    def extend(self, binding: Binding, resources: list[Path]) -> Binding:
        """``binding`` after entering ``resources`` (outermost first): names not bound yet
        bind to their anchors."""
        bound = dict(binding)
        for resource in resources:
            for name, anchor in self.doc.anchors.get(resource, {}).items():
                if name in self.names and name not in bound:
                    bound[name] = anchor
        return tuple(sorted(bound.items()))

    def build(self) -> dict[str, Any]:
        root = self.walk((), self.root_binding, keep_defs=True)
        defs = root.setdefault("$defs", {})
        while self.todo:
            path, binding, name = self.todo.pop()
            defs[name] = self.walk(path, binding, keep_defs=False)
        self.plain_leftovers(root)
        return root

    def target(self, path: Path, binding: Binding) -> str:
        """The reference to ``path`` evaluated under ``binding``."""

        if path not in self.sensitive:
            return pointer(path)
        if path == () and binding == self.root_binding:
            return "#"
        key = (path, binding)
        if key not in self.copies:
            if len(self.copies) >= MAX_COPIES:
                raise _TooMany
            name = f"dyn_{len(self.copies)}"
            while name in self.doc.nodes[()].get("$defs", {}):
                name += "_"
            self.copies[key] = name
            self.todo.append((path, binding, name))
        return f"#/$defs/{self.copies[key]}"

    def reference(self, path: Path, keyword: str, binding: Binding) -> str | None:
        """Where the ``keyword`` reference of ``path`` leads under ``binding`` (None: leave
        it as written)."""
        found = self.doc.refs.get((path, keyword))
        if found is None:
            return None
        target = found
        if keyword == "$dynamicRef" and path in self.doc.bookended:
            target = dict(binding).get(self.doc.bookended[path], target)
        # NOTE: a reference enters the innermost resource holding its target, not the ones
        # its pointer crosses (the suite's optional "pointer reference across resource
        # boundary" case; referencing evolves the base URI through them without a push)
        return self.target(target, self.extend(binding, [self.doc.resource_of[target]]))

    def walk(self, path: Path, binding: Binding, *, keep_defs: bool) -> dict[str, Any]:
        """The subschema at ``path`` evaluated under ``binding`` (a new object)."""
        node = self.doc.nodes[path]
        out: dict[str, Any] = {}
        refs: list[str] = []
        for key, value in node.items():
            if key in _NOT_EVALUATED:
                if keep_defs:
                    out[key] = self.copy(value)
            elif key in ("$ref", "$dynamicRef"):
                ref = self.reference(path, key, binding)
                refs.append(value if ref is None else ref)
            else:
                here = path + (key,)
                if isinstance(value, list):
                    out[key] = [self.sub(here + (str(i),), v, binding, keep_defs)
                                for i, v in enumerate(value)]
                elif isinstance(value, dict) and here not in self.doc.nodes:
                    out[key] = {k: self.sub(here + (k,), v, binding, keep_defs)
                                for k, v in value.items()}
                else:
                    out[key] = self.sub(here, value, binding, keep_defs)
        if refs:
            out["$ref"] = refs[0]
            if len(refs) > 1:
                out["allOf"] = [*out.get("allOf", []), {"$ref": refs[1]}]
        return out

    def sub(self, where: Path, value: Any, binding: Binding, keep_defs: bool) -> Any:
        """A value inside a subschema: a subschema met by descent (entering its resource if
        it has ``$id``), else copied."""
        if where not in self.doc.nodes or where not in self.doc.evaluated_in:
            return self.copy(value)
        if where in self.doc.anchors:
            binding = self.extend(binding, [where])
        return self.walk(where, binding, keep_defs=keep_defs)

    def plain_leftovers(self, root: dict[str, Any]) -> None:
        """``$dynamicRef``s left in the kept ``$defs`` (their subschemas are now reached only
        through copies) -> ``$ref``s to their initial targets. The kept ``$defs`` sit at their
        original paths."""

        for node, parts in iter_any_draft(root):
            ref = node.pop("$dynamicRef", None)
            if ref is None:
                continue
            found = self.doc.refs.get((_key(parts), "$dynamicRef"))
            plain = ref if found is None else pointer(found)
            if "$ref" in node:
                node.setdefault("allOf", []).append({"$ref": plain})
            else:
                node["$ref"] = plain
