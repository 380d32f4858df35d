"""Refuse schemas that have no finite instance: a ``$ref`` cycle with no base case.

``{"$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}},
"required": ["x"]}}, "$ref": "#/$defs/a"}`` describes only infinitely deep objects. A backend
given it never completes a value: llguidance runs out of forced-token items, and xgrammar's
ahead-of-time compile grew the engine process by gigabytes until the OOM killer ended it. So the
front end refuses it, naming the ``$ref`` that cannot end.

A subschema is *productive* when some finite value satisfies what it requires of itself and of
the subschemas it must contain. Computed as a least fixpoint over every subschema (monotone:
only "requires" edges), so a recursion with a base case anywhere is productive:

- ``false`` is not; ``true`` and ``{}`` are;
- every ``allOf`` member and the ``$ref`` target must be productive, and at least one member
  of ``anyOf`` / ``oneOf``;
- its own keywords need one finite value of an allowed type: a scalar type (or ``const`` /
  ``enum``) always has one; an object needs every ``required`` key's subschema productive;
  an array needs its first ``minItems`` item subschemas productive.

The check is conservative toward acceptance: keywords it does not model (``not``, ``if``,
``minProperties`` ...) never make a subschema unproductive, so it refuses only schemas that
certainly have no finite instance.
"""

from __future__ import annotations

from typing import Any

from grammarserve.errors import SchemaValidationError
from grammarserve.fsm.json_schema import iter_subschemas, json_path, resolve_pointer

_SCALARS = frozenset({"null", "boolean", "number", "integer", "string"})
_ALL = _SCALARS | {"object", "array"}


def check_finite(schema: dict[str, Any]) -> None:
    """Raise ``SchemaValidationError`` naming the ``$ref`` path if ``schema`` has no finite
    instance because of a recursion without a base case."""
    nodes = {id(sub): (sub, path) for sub, path in iter_subschemas(schema)}
    productive = _Productive(set(nodes))
    changed = True
    while changed:
        changed = False
        for key, (sub, _) in nodes.items():
            if key not in productive.ids and _productive(schema, sub, productive):
                productive.ids.add(key)
                changed = True
    if id(schema) in productive.ids:
        return
    refs = [path for key, (sub, path) in nodes.items()
            if "$ref" in sub and key not in productive.ids]
    if not refs:
        raise SchemaValidationError("the schema has no instance: a required property or item "
                                    "can never be satisfied (a `false` subschema)", path="$")
    where = json_path(next((p for p in refs if p), refs[0]))  # inside the cycle, not the root
    raise SchemaValidationError(
        f"the schema has no finite instance: the $ref at {where} can never be completed (it "
        "recurses with no base case, so every value must contain another one, or it leads to "
        "`false`); make the recursive property optional, or allow an empty array or null",
        path=where)


class _Productive:
    """The subschemas known productive so far (``ids``) among those walked (``known``)."""

    def __init__(self, known: set[int]) -> None:
        self.known = known
        self.ids: set[int] = set()


def _ok(root: dict[str, Any], sub: Any, productive: _Productive) -> bool:
    if isinstance(sub, bool):
        return sub
    if not isinstance(sub, dict):
        return True  # not a schema; refused elsewhere
    # NOTE: a subschema the walk does not reach (a $ref into an odd place) is not modelled.
    return id(sub) in productive.ids or id(sub) not in productive.known


def _productive(root: dict[str, Any], sub: dict[str, Any], productive: _Productive) -> bool:
    ref = sub.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        try:
            target = resolve_pointer(root, ref)
        except (KeyError, ValueError, IndexError):
            target = {}  # an unresolved ref is refused elsewhere; do not refuse it here
        if not _ok(root, target, productive):
            return False
    if not all(_ok(root, m, productive) for m in _list(sub, "allOf")):
        return False
    for key in ("anyOf", "oneOf"):
        members = _list(sub, key)
        if members and not any(_ok(root, m, productive) for m in members):
            return False
    return _own_value(root, sub, productive)


def _own_value(root: dict[str, Any], sub: dict[str, Any], productive: _Productive) -> bool:
    if "const" in sub or "enum" in sub:
        return True
    t = sub.get("type", sorted(_ALL))
    types = {t} if isinstance(t, str) else set(t) if isinstance(t, list) else set(_ALL)
    if types & _SCALARS or not types & {"object", "array"}:
        return True
    if "object" in types and _object_ok(root, sub, productive):
        return True
    return "array" in types and _array_ok(root, sub, productive)


def _object_ok(root: dict[str, Any], sub: dict[str, Any], productive: _Productive) -> bool:
    props = sub.get("properties")
    props = props if isinstance(props, dict) else {}
    extra = sub.get("additionalProperties", True)
    return all(_ok(root, props.get(k, extra), productive)
               for k in _list(sub, "required") if isinstance(k, str))


def _array_ok(root: dict[str, Any], sub: dict[str, Any], productive: _Productive) -> bool:
    need = sub.get("minItems", 0)
    if not isinstance(need, int) or need <= 0:
        return True
    prefix = _list(sub, "prefixItems")
    items = sub.get("items", True)
    return all(_ok(root, prefix[i] if i < len(prefix) else items, productive)
               for i in range(min(need, len(prefix) + 1)))


def _list(sub: dict[str, Any], key: str) -> list[Any]:
    value = sub.get(key)
    return value if isinstance(value, list) else []
