"""The front end's exact rewrites, in order (each a schema -> schema function of its own
module, applied in place to a private copy):

1. ``schema/read/metaschemas.py``: ``$ref``s into the JSON Schema meta-schemas, bundled into ``$defs``;
   ``localrefs.hoist_ref_targets``: subschemas a ``$ref`` reaches below a keyword the steps
   below restructure (or below an unknown keyword) copied into ``$defs``;
2. ``schema/rewrite/unevaluated.py``: ``unevaluated*`` without in-place applicators ->
   ``additionalProperties``/``items``;
3. ``schema/rewrite/negated.py``: ``not`` -> its exact negation;
4. ``schema/rewrite/conditions.py``: ``if``/``then``/``else`` -> ``anyOf`` of the two cases;
   ``dependentRequired`` (and array-only ``dependencies``) -> disjoint cases;
   ``dependentSchemas`` -> ``anyOf`` of "key absent" and "key present and its schema";
5. ``schema/rewrite/unique.py``: ``uniqueItems`` over finite item domains -> an ``enum`` of arrays.

With ``checks`` (a list), what has no exact form is offered to a ``checks.CheckCollector``
(``schema/checks/plan.py``: ``unevaluated*`` and ``oneOf`` before step 3, the rest after step 5):
where the value it constrains can be validated when it closes, the keyword is removed and its
run-time check appended to ``checks``; else it is refused as without.

(``oneOf`` -> ``anyOf`` for disjoint branches, ``schema/algebra/disjoint.py``, runs in ``normalize``,
after the strict-mode check, which refuses ``oneOf``; with checks it runs before step 3.)

A rewrite that has no exact form raises :class:`~grammarserve.errors.UnsupportedSchemaError`
with the keyword's path, or leaves the keyword for ``json_schema.check_keywords`` to refuse.
Negating a condition can re-create a keyword handled by a later step (``dependentRequired``
inside an ``if``), so the steps run until nothing changes (at most :data:`_ROUNDS` times).
"""

from __future__ import annotations

from typing import Any

from grammarserve.fsm.schema.checks.plan import take_early, take_late
from grammarserve.fsm.schema.checks.split import CheckCollector
from grammarserve.fsm.schema.read.localrefs import hoist_ref_targets
from grammarserve.fsm.schema.read.metaschemas import resolve_meta_refs
from grammarserve.fsm.schema.rewrite.conditions import (
    rewrite_conditions,
    rewrite_dependencies,
    rewrite_dependent_schemas,
    rewrite_switches,
)
from grammarserve.fsm.schema.rewrite.negated import rewrite_not
from grammarserve.fsm.schema.rewrite.unevaluated import rewrite_unevaluated
from grammarserve.fsm.schema.rewrite.unique import rewrite_unique
from grammarserve.fsm.schema.tree import iter_subschemas
from grammarserve.fsm.value_check import ValueCheck

_ROUNDS = 3


def rewrite_schema(schema: dict[str, Any], *, checks: list[ValueCheck] | None = None,
                   lean: bool = False) -> dict[str, Any]:
    """Apply the rewrites above to ``schema`` (in place) and return it; with ``checks``, hand
    what they leave to run-time checks (appended to ``checks``) where that is exact.

    ``lean`` (with ``checks``): conditions (``not``, ``if``, ``dependent*``, ``oneOf``) become
    run-time checks wherever that is exact, before their rewrite into cases is tried. The
    grammar is then looser but smaller: for schemas whose cases a backend cannot intersect
    (llguidance's "schema too large"; ``GrammarCompiler`` retries those this way)."""
    resolve_meta_refs(schema)
    hoist_ref_targets(schema)
    rewrite_unevaluated(schema)
    collector = CheckCollector(schema) if checks is not None else None
    take = collector.take if collector is not None else None
    lean = lean and take is not None
    if collector is not None:
        with collector.batch():
            take_early(schema, collector, lean=lean)
    prefer = take if lean else None
    for _ in range(_ROUNDS):
        if not _pending(schema):
            break
        rewrite_not(schema, take, prefer=lean)
        if not lean:
            rewrite_switches(schema)
        rewrite_conditions(schema, take, prefer=lean)
        rewrite_dependencies(schema, prefer)
        rewrite_dependent_schemas(schema, prefer)
        if collector is not None:
            with collector.batch():  # it adds enums of arrays: no $ref moves
                rewrite_unique(schema, take)
        else:
            rewrite_unique(schema, take)
    if collector is not None and checks is not None:
        with collector.batch():
            take_late(schema, collector.take)
        checks.extend(collector.checks)
    return schema


def _pending(schema: dict[str, Any]) -> bool:
    return any(k in sub for sub, _ in iter_subschemas(schema)
               for k in ("not", "if", "then", "else", "dependentRequired", "dependencies",
                         "dependentSchemas", "uniqueItems"))
