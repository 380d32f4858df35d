"""The front end's exact rewrites, in order (each a schema -> schema function of its own
module, applied in place to a private copy):

1. ``metaschemas.py``: ``$ref``s into the JSON Schema meta-schemas, bundled into ``$defs``;
2. ``rewrite_not.py``: ``not`` -> its exact negation;
3. ``rewrite_cond.py``: ``if``/``then``/``else`` -> ``anyOf`` of the two cases;
   ``dependentRequired`` (and array-only ``dependencies``) -> disjoint cases;
4. ``rewrite_unique.py``: ``uniqueItems`` over finite item domains -> an ``enum`` of arrays.

(``oneOf`` -> ``anyOf`` for disjoint branches, ``rewrite_oneof.py``, runs in ``normalize``,
after the strict-mode check, which refuses ``oneOf``.)

A rewrite that has no exact form raises :class:`~grammarserve.errors.UnsupportedSchemaError`
with the keyword's path, or leaves the keyword for ``json_schema.check_keywords`` to refuse.
Negating a condition can re-create a keyword handled by a later step (``dependentRequired``
inside an ``if``), so the steps run until nothing changes (at most :data:`_ROUNDS` times).
"""

from __future__ import annotations

from typing import Any

from grammarserve.fsm.json_schema import iter_subschemas
from grammarserve.fsm.metaschemas import resolve_meta_refs
from grammarserve.fsm.rewrite_cond import rewrite_conditions, rewrite_dependencies
from grammarserve.fsm.rewrite_not import rewrite_not
from grammarserve.fsm.rewrite_unique import rewrite_unique

#: Keywords these rewrites remove (``json_schema.check_keywords`` refuses what is left).
REWRITTEN = frozenset({"not", "if", "dependentRequired", "dependencies", "uniqueItems"})
_ROUNDS = 3


def rewrite_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Apply the rewrites above to ``schema`` (in place) and return it."""
    resolve_meta_refs(schema)
    for _ in range(_ROUNDS):
        if not _pending(schema):
            break
        rewrite_not(schema)
        rewrite_conditions(schema)
        rewrite_dependencies(schema)
        rewrite_unique(schema)
    return schema


def _pending(schema: dict[str, Any]) -> bool:
    return any(k in sub for sub, _ in iter_subschemas(schema)
               for k in ("not", "if", "then", "else", "dependentRequired", "dependencies",
                         "uniqueItems"))
