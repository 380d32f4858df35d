"""Refuse schemas with no instance, and schemas with a part that can be entered but never ended.

``{"$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}},
"required": ["x"]}}, "$ref": "#/$defs/a"}`` describes only infinitely deep objects. A backend
given it never completes a value: llguidance runs out of Earley items, and xgrammar's
jump-forward loops, allocating until the OOM killer ends the engine (issue 20). The same holds
when such a ``$ref`` is only optional (``{"properties": {"x": {"$ref": "#/$defs/a"}}}``): a
model that writes ``{"x":`` enters a value that can never end. So the front end refuses both,
naming the ``$ref``; and a schema that has no instance for a simpler reason (``minItems`` over
``maxItems``, contradictory ``type``s, an empty ``enum``, see ``schema/algebra/empty.py``) is refused naming
the keyword, instead of a backend's wording or a request that can only fail.

A subschema is *productive* when some finite value satisfies what it requires of itself and of
the subschemas it must contain; a least fixpoint over every subschema (monotone: only
"requires" edges), so a recursion with a base case anywhere is productive:

- ``false`` is not; ``true`` and ``{}`` are;
- every ``allOf`` member and the ``$ref`` target must be productive, and at least one member
  of ``anyOf`` / ``oneOf``;
- with ``const`` / ``enum``: some candidate value validates against the subschema;
- otherwise a type its own keywords allow (``schema/algebra/empty.py``): a scalar type always has a value; an
  object needs every ``required`` key's subschema productive and ``minProperties`` properties
  it can write; an array needs its first ``minItems`` item subschemas productive.

Keywords it does not model (``not``, ``pattern``, bounds split across ``allOf`` members...) never
make a subschema unproductive, so it refuses only schemas that certainly have no instance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grammarserve.errors import SchemaValidationError
from grammarserve.fsm.schema.algebra.empty import Context, Emptiness, own_emptiness, possible_types
from grammarserve.fsm.schema.tree import iter_subschemas, json_path, resolve_pointer

#: Keywords whose subschemas a generated value may enter (``not``, ``if`` and
#: ``propertyNames`` describe values that are never written out as such).
_ENTERED_ONE = ("additionalProperties", "items", "contains", "then", "else",
                "unevaluatedItems", "unevaluatedProperties")
_ENTERED_MAP = ("properties", "patternProperties", "dependentSchemas")
_ENTERED_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")


def check_finite(schema: dict[str, Any]) -> None:
    """Raise ``SchemaValidationError`` if ``schema`` has no instance, or a part a value may
    enter (reachable from the root) that recursion keeps from ever being completed; the
    message names the ``$ref`` (or the keyword) and its JSON path."""
    analysis = _Analysis(schema)
    root = id(schema)
    if root not in analysis.productive:
        raise analysis.refusal(root, entered=False)
    for key in analysis.reachable():
        if key not in analysis.productive:
            cause = analysis.explain(key)
            if cause.cycle:
                raise analysis.refusal(key, entered=True)


@dataclass(frozen=True)
class _Cause:
    """Why a subschema is unproductive: at ``path``, a ``$ref`` cycle or ``reason``."""

    path: tuple[str | int, ...]
    cycle: bool = False
    reason: Emptiness | None = None


class _Analysis:
    """The productive subschemas of one schema (``productive``: their ids)."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.ctx = Context(root)
        self.nodes = {id(sub): (sub, path) for sub, path in iter_subschemas(root)}
        self._own: dict[int, Emptiness | None] = {}
        self.productive: set[int] = set()
        self._solve()

    # -- the fixpoint ----------------------------------------------------------------------
    def _solve(self) -> None:
        # NOTE: a worklist over reverse "requires" edges: a subschema is looked at again only
        # when one it depends on became productive.
        dependents: dict[int, list[int]] = {}
        for key, (sub, _) in self.nodes.items():
            for child in self._depends_on(sub):
                dependents.setdefault(id(child), []).append(key)
        # NOTE: the walk's order reversed puts every subschema after the ones it contains, so
        # most are decided on their first look; a dependent is looked at again only if it was
        # looked at already (and failed): one not yet looked at sees the change when its turn
        # comes. (Pushing every dependent at once made a parent fail once per child.)
        work = list(self.nodes)
        failed: set[int] = set()
        while work:
            key = work.pop()
            if key in self.productive:
                continue
            if not self._is_productive(self.nodes[key][0]):
                failed.add(key)
                continue
            self.productive.add(key)
            failed.discard(key)
            work.extend(k for k in dependents.get(key, ()) if k in failed)

    def _depends_on(self, sub: dict[str, Any]) -> list[Any]:
        out = [self._target(sub)]
        for key in ("allOf", "anyOf", "oneOf", "prefixItems"):
            out += _list(sub, key)
        props = sub.get("properties")
        if isinstance(props, dict):
            out += props.values()
        out += [sub.get("additionalProperties"), sub.get("items")]
        return [c for c in out if isinstance(c, dict)]

    def own(self, sub: dict[str, Any]) -> Emptiness | None:
        key = id(sub)
        if key not in self._own:
            self._own[key] = own_emptiness(self.ctx, sub)
        return self._own[key]

    def ok(self, sub: Any) -> bool:
        """Whether ``sub`` (a subschema, a boolean, or something else) is productive."""
        if isinstance(sub, bool):
            return sub
        if not isinstance(sub, dict):
            return True  # not a schema; refused elsewhere
        # NOTE: a subschema the walk does not reach (a $ref into an odd place) is not modelled.
        return id(sub) in self.productive or id(sub) not in self.nodes

    def _target(self, sub: dict[str, Any]) -> Any:
        ref = sub.get("$ref")
        if not (isinstance(ref, str) and ref.startswith("#")):
            return True
        try:
            return resolve_pointer(self.root, ref)
        except (KeyError, ValueError, IndexError):
            return True  # an unresolved ref is refused elsewhere; do not refuse it here

    def _is_productive(self, sub: dict[str, Any]) -> bool:
        return self._culprit(sub) is None

    def _culprit(self, sub: dict[str, Any]) -> Any:
        """What keeps ``sub`` from being productive: an unproductive subschema it requires
        (or ``False``), an :class:`Emptiness`, or None when it is productive."""
        own = self.own(sub)
        if own is not None:
            return own
        if "const" in sub or "enum" in sub:
            return None  # a candidate value validated against the whole subschema
        target = self._target(sub)
        if not self.ok(target):
            return target
        for member in _list(sub, "allOf"):
            if not self.ok(member):
                return member
        for key in ("anyOf", "oneOf"):
            members = _list(sub, key)
            if members and not any(self.ok(m) for m in members):
                return members[0]
        causes = []
        for t in possible_types(self.ctx, sub):
            cause = (self._object_culprit(sub) if t == "object" else
                     self._array_culprit(sub) if t == "array" else None)
            if cause is None:
                return None
            causes.append(cause)
        return causes[0] if causes else Emptiness("type", "no type is possible")

    def _object_culprit(self, sub: dict[str, Any]) -> Any:
        props = sub.get("properties")
        props = props if isinstance(props, dict) else {}
        extra = sub.get("additionalProperties", True)
        patterns = sub.get("patternProperties")
        required = list(dict.fromkeys(k for k in _list(sub, "required") if isinstance(k, str)))
        for name in required:
            schema = props.get(name, True if name not in props and patterns else extra)
            if not self.ok(schema):
                return schema
        need = sub.get("minProperties", 0)
        if not isinstance(need, int) or need <= len(required):
            return None
        optional = sum(1 for k, v in props.items() if k not in required and self.ok(v))
        if self.ok(extra) or (isinstance(patterns, dict) and patterns):
            return None  # any number of further properties can be written
        if len(required) + optional < need:
            return Emptiness("minProperties", f"minProperties ({need}) cannot be met: at most "
                                              f"{len(required) + optional} properties can be "
                                              "written")
        return None

    def _array_culprit(self, sub: dict[str, Any]) -> Any:
        need = sub.get("minItems", 0)
        if not isinstance(need, int) or need <= 0:
            return None
        prefix = _list(sub, "prefixItems")
        items = sub.get("items", True)
        for i in range(min(need, len(prefix) + 1)):
            schema = prefix[i] if i < len(prefix) else items
            if not self.ok(schema):
                return schema
        return None

    # -- reachability and explanations -----------------------------------------------------
    def reachable(self) -> list[int]:
        """Ids of the subschemas a value may enter, from the root (``$ref``s followed)."""
        seen = {id(self.root)}
        order = [id(self.root)]
        stack = [self.root]
        while stack:
            sub = stack.pop()
            for child in self._entered(sub):
                if isinstance(child, dict) and id(child) in self.nodes and id(child) not in seen:
                    seen.add(id(child))
                    order.append(id(child))
                    stack.append(child)
        return order

    def _entered(self, sub: dict[str, Any]) -> list[Any]:
        out = [self._target(sub)]
        out += [sub.get(k) for k in _ENTERED_ONE]
        for key in _ENTERED_MAP:
            value = sub.get(key)
            if isinstance(value, dict):
                out += value.values()
        for key in _ENTERED_LIST:
            out += _list(sub, key)
        return out

    def explain(self, key: int) -> _Cause:
        """Follow what keeps subschema ``key`` unproductive down to its first cause: a keyword
        no value satisfies, or a ``$ref`` cycle (reported at the first ``$ref`` inside it)."""
        chain: list[int] = []
        where: dict[int, int] = {}
        while True:
            sub, path = self.nodes[key]
            if key in where:
                cycle = chain[where[key]:]
                first = next((k for k in cycle if "$ref" in self.nodes[k][0]), cycle[0])
                return _Cause(self.nodes[first][1], cycle=True)
            where[key] = len(chain)
            chain.append(key)
            culprit = self._culprit(sub)
            if isinstance(culprit, Emptiness):
                return _Cause(path + (culprit.keyword,), reason=culprit)
            if isinstance(culprit, dict) and id(culprit) in self.nodes:
                key = id(culprit)
                continue
            return _Cause(path, reason=Emptiness(
                "false", "a subschema it requires is `false`, which no value satisfies"))

    def refusal(self, key: int, *, entered: bool) -> SchemaValidationError:
        cause = self.explain(key)
        where = json_path(cause.path)
        if cause.cycle:
            what = ("has a part with no finite instance" if entered
                    else "has no finite instance")
            return SchemaValidationError(
                f"the schema {what}: the $ref at {where} can never be completed (it recurses "
                "with no base case, so every value must contain another one); make the "
                "recursive property optional, or allow an empty array or null", path=where)
        assert cause.reason is not None
        return SchemaValidationError(f"the schema has no instance: at {where}: "
                                     f"{cause.reason.message}", path=where)


def _list(sub: dict[str, Any], key: str) -> list[Any]:
    value = sub.get(key)
    return value if isinstance(value, list) else []
