"""The front end's exact rewrites, in order (each a schema -> schema function of its own
module, applied in place to a private copy):

1. ``metaschemas.py``: ``$ref``s into the JSON Schema meta-schemas, bundled into ``$defs``;
2. ``rewrite_not.py``: ``not`` -> its exact negation;
3. ``rewrite_cond.py``: ``if``/``then``/``else`` -> ``anyOf`` of the two cases;
   ``dependentRequired`` (and array-only ``dependencies``) -> disjoint cases;
4. ``rewrite_unique.py``: ``uniqueItems`` over finite item domains -> an ``enum`` of arrays.

With ``checks`` (a list), what has no exact form of ``not``, ``uniqueItems`` and ``contains``
is offered to a ``checks.CheckCollector``: where the value it constrains can be validated when
it closes, the keyword is removed and its run-time check appended to ``checks``; else it is
refused as without.

(``oneOf`` -> ``anyOf`` for disjoint branches, ``rewrite_oneof.py``, runs in ``normalize``,
after the strict-mode check, which refuses ``oneOf``.)

A rewrite that has no exact form raises :class:`~grammarserve.errors.UnsupportedSchemaError`
with the keyword's path, or leaves the keyword for ``json_schema.check_keywords`` to refuse.
Negating a condition can re-create a keyword handled by a later step (``dependentRequired``
inside an ``if``), so the steps run until nothing changes (at most :data:`_ROUNDS` times).
"""

from __future__ import annotations

from typing import Any

from grammarserve.fsm.checks import CheckCollector
from grammarserve.fsm.json_schema import iter_subschemas
from grammarserve.fsm.metaschemas import resolve_meta_refs
from grammarserve.fsm.rewrite_cond import rewrite_conditions, rewrite_dependencies
from grammarserve.fsm.rewrite_not import rewrite_not
from grammarserve.fsm.rewrite_unique import rewrite_unique
from grammarserve.fsm.value_check import ValueCheck

#: Keywords these rewrites remove (``json_schema.check_keywords`` refuses what is left).
REWRITTEN = frozenset({"not", "if", "dependentRequired", "dependencies", "uniqueItems"})
_ROUNDS = 3


def rewrite_schema(schema: dict[str, Any], *, checks: list[ValueCheck] | None = None
                   ) -> dict[str, Any]:
    """Apply the rewrites above to ``schema`` (in place) and return it; with ``checks``, hand
    what they leave of ``not``, ``uniqueItems`` and ``contains`` to run-time checks (appended
    to ``checks``) where that is exact."""
    resolve_meta_refs(schema)
    collector = CheckCollector(schema) if checks is not None else None
    take = collector.take if collector is not None else None
    for _ in range(_ROUNDS):
        if not _pending(schema):
            break
        rewrite_not(schema, take)
        rewrite_conditions(schema)
        rewrite_dependencies(schema)
        rewrite_unique(schema, take)
    if collector is not None and checks is not None:
        for sub, parts in reversed(list(iter_subschemas(schema))):
            if "contains" in sub:
                collector.take(parts, "contains")
            if sub.get("uniqueItems") is True:
                collector.take(parts, "uniqueItems")
        checks.extend(collector.checks)
    return schema


def _pending(schema: dict[str, Any]) -> bool:
    return any(k in sub for sub, _ in iter_subschemas(schema)
               for k in ("not", "if", "then", "else", "dependentRequired", "dependencies",
                         "uniqueItems"))
