"""Repeated members of ``allOf`` and ``anyOf`` dropped (a meaning-preserving rewrite, run at the
end of ``normalize``).

``{"allOf": [{"$ref": "#/$defs/run"}], "anyOf": [{"$ref": "#/$defs/run"}]}`` (devinit's
``items``) asks for the same subschema twice. llguidance intersects the two copies as written:
with a 31-string enum inside, that took ~50 ms per JSON style, against ~1 ms for one copy. So:

- an ``allOf`` member identical to an earlier one is dropped (``A and A`` is ``A``);
- an ``anyOf`` member identical to an earlier one is dropped (``A or A`` is ``A``);
- an ``anyOf`` or ``oneOf`` of one member that is also an ``allOf`` member beside it is dropped
  (it asserts that member again).

``oneOf`` members are never deduplicated (two identical branches mean "never both", so the pair
accepts nothing). Members are identical when their JSON texts are (key order included: the
backends write an object's keys in schema order). Lists a ``$ref`` points into are left as they
are (removing a member would move the members after it).
"""

from __future__ import annotations

import json
from typing import Any

from grammarserve.fsm.schema.tree import iter_refs, iter_subschemas, pointer_parts


def dedupe_members(schema: dict[str, Any]) -> dict[str, Any]:
    """Apply the rewrites above to ``schema`` in place (a private copy) and return it."""
    todo = [(sub, parts) for sub, parts in iter_subschemas(schema) if _has_repeats(sub)]
    if not todo:
        return schema
    referenced = _referenced_lists(schema)
    for sub, parts in todo:
        where = tuple(str(p) for p in parts)
        for key in ("allOf", "anyOf"):
            members = sub.get(key)
            if isinstance(members, list) and (where, key) not in referenced:
                sub[key] = _unique(members)
        kept = [_text(m) for m in sub["allOf"]] if isinstance(sub.get("allOf"), list) else []
        for key in ("anyOf", "oneOf"):
            members = sub.get(key)
            if (isinstance(members, list) and len(members) == 1 and _text(members[0]) in kept
                    and (where, key) not in referenced):
                del sub[key]
    return schema


def _has_repeats(sub: dict[str, Any]) -> bool:
    """A cheap test (``==``, which ignores key order and equates ``1`` and ``true``) that ``sub``
    may hold a member the rewrite drops; :func:`_text` decides."""
    all_of = sub.get("allOf")
    all_of = all_of if isinstance(all_of, list) else []
    for key in ("anyOf", "oneOf"):
        members = sub.get(key)
        if isinstance(members, list) and len(members) == 1 and members[0] in all_of:
            return True
    for key in ("allOf", "anyOf"):
        members = sub.get(key)
        if isinstance(members, list) and len(members) > 1 and _any_equal(members):
            return True
    return False


def _any_equal(members: list[Any]) -> bool:
    if len(members) > 32:  # NOTE: texts instead of pairwise comparisons
        texts = [_text(m) for m in members]
        return len(set(texts)) < len(texts)
    return any(members[i] == members[j] for i in range(len(members))
               for j in range(i + 1, len(members)))


def _unique(members: list[Any]) -> list[Any]:
    seen: set[str] = set()
    out = []
    for member in members:
        text = _text(member)
        if text not in seen:
            seen.add(text)
            out.append(member)
    return out


def _text(member: Any) -> str:
    return json.dumps(member, separators=(",", ":"), ensure_ascii=False)


def _referenced_lists(schema: dict[str, Any]) -> set[tuple[tuple[str, ...], str]]:
    """(subschema path, key) pairs some local ``$ref`` points into or through."""

    out: set[tuple[tuple[str, ...], str]] = set()
    for sub, _ in iter_refs(schema):
        ref = sub["$ref"]
        if ref.startswith("#"):
            steps = pointer_parts(ref)
            out.update((tuple(steps[:i]), steps[i]) for i in range(len(steps)))
    return out
