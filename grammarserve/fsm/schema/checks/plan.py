"""Which keywords become run-time value checks (``checks.CheckCollector``), and when.

``schema/rewrites.py`` calls :func:`take_early` before any exact rewrite and :func:`take_late` after
them. Each offer is declined where a check would not be exact (``schema/checks/split.py``); the keyword is
then refused as before, with its path.

Early, so that the checks validate what the user wrote:

- ``unevaluatedProperties``/``unevaluatedItems`` (after ``schema/rewrite/unevaluated.py`` has turned the
  ones without in-place applicators into ``additionalProperties``/``items``): which members
  they see depends on the annotations of every keyword beside them, and the rewrites below
  (``not`` made positive, ``if`` as cases) change annotations;
- ``oneOf``: provably disjoint ones become ``anyOf`` here, those with exact exclusive cases
  (``schema/rewrite/oneof.py``) become the ``anyOf`` of the cases, both exactly (as
  ``normalize`` would, but now, so that the keywords in their branches can be checked); the
  grammar gets ``anyOf`` for the rest, and a check says exactly one branch holds. Outer ones
  first, in rounds while a take makes more reachable.

Late, what the rewrites leave: ``contains`` (with min/maxContains), ``uniqueItems`` on open
item domains, ``propertyNames``, ``min/maxProperties`` where llguidance cannot count members
(an object with optional named members that may also have others), a ``pattern`` using what
the backends' regex engines lack (look-around, back-references, possessive quantifiers,
``(?m)``: the grammar keeps its superset, ``regex_superset.py``), and ``patternProperties``
with such a pattern or with patterns a name could match two of (which llguidance refuses):
the grammar then gives the other members ``additionalProperties`` or any of the patterns'
schemas. Patterns with a construct no superset stands for (atomic groups, conditionals) are
never taken: ``json_schema.check_keywords`` refuses them, naming the construct.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from grammarserve.fsm.regex_superset import constructs, first_refused, superset
from grammarserve.fsm.schema.algebra.disjoint import pairwise_disjoint
from grammarserve.fsm.schema.algebra.negate import Negator
from grammarserve.fsm.schema.checks.split import CheckCollector
from grammarserve.fsm.schema.rewrite.negated import attach
from grammarserve.fsm.schema.rewrite.oneof import exclusive_cases
from grammarserve.fsm.schema.tree import iter_subschemas

Take = Callable[[tuple[str | int, ...], str], bool]
_APPLICATORS = ("allOf", "anyOf", "oneOf", "$ref", "if", "dependentSchemas")
#: Passes over the ``oneOf``s while takes make others reachable.
_ROUNDS = 4


def take_early(schema: dict[str, Any], collector: CheckCollector, *, lean: bool = False
               ) -> None:
    """Offer ``unevaluated*``, then the ``oneOf``s without an exact rewrite, to ``collector``
    (in place; in one of its batches). ``lean``: no ``oneOf`` becomes cases (each case
    repeats the other branches negated); they are offered as they are."""
    has_oneof = False
    for sub, parts in list(iter_subschemas(schema)):
        has_oneof = has_oneof or "oneOf" in sub
        for key in ("unevaluatedProperties", "unevaluatedItems"):
            if key in sub:
                collector.take(parts, key)
    if not has_oneof:
        return  # NOTE: the takes above only remove keywords: no oneOf appeared
    negator: Negator | None = None
    exact: set[int] = set()
    for _ in range(_ROUNDS):
        changed = False
        # NOTE: lazily, outer first: a node's children are read after it is yielded, so the
        # paths below a oneOf that just became anyOf are the new ones
        for sub, parts in iter_subschemas(schema):
            branches = sub.get("oneOf")
            if not isinstance(branches, list) or id(sub) in exact:
                continue
            if "anyOf" not in sub and pairwise_disjoint(schema, branches):
                sub["anyOf"] = sub.pop("oneOf")
                collector.rename(parts + ("oneOf",), parts + ("anyOf",))
                continue
            negator = negator or Negator(schema)
            cases = None if lean else exclusive_cases(negator, sub)
            if cases and not collector.points_into(parts + ("oneOf",)):
                del sub["oneOf"]  # as normalize would, but now: checks below see anyOf
                attach(sub, cases[0] if len(cases) == 1 else {"anyOf": cases})
                collector.moved()  # the cases hold copies of the branches, and their $refs
            elif collector.take(parts, "oneOf"):
                changed = True  # (also when $refs point into the branches: they follow)
            elif cases is not None:
                exact.add(id(sub))  # left for normalize (or the backend) to decide
        if not changed:
            break  # a take can make a oneOf reachable that was not (one inside its branches)


def take_late(schema: dict[str, Any], take: Take) -> None:
    """Offer what the exact rewrites left (see the module docstring), innermost first."""
    for sub, parts in reversed(list(iter_subschemas(schema))):
        if "contains" in sub:
            take(parts, "contains")
        if sub.get("uniqueItems") is True:
            take(parts, "uniqueItems")
        if sub.get("propertyNames") in (True, {}, {"type": "string"}):
            del sub["propertyNames"]  # every member name is a string
        if "propertyNames" in sub:
            take(parts, "propertyNames")
        count = next((k for k in ("minProperties", "maxProperties") if k in sub), None)
        if count is not None and not counts_members(sub):
            take(parts, count)
        if isinstance(sub.get("pattern"), str) and not regular(sub["pattern"]) \
                and superset(sub["pattern"]) is not None:
            take(parts, "pattern")  # the grammar keeps the superset (checks.py)
        patterns = sub.get("patternProperties")
        if isinstance(patterns, dict) and patterns and (
                not all(regular(p) for p in patterns) or not disjoint_patterns(tuple(patterns))
                ) and all(first_refused(p) is None for p in patterns):
            take(parts, "patternProperties")


def counts_members(sub: dict[str, Any]) -> bool:
    """Whether llguidance enforces ``min/maxProperties`` of ``sub`` (it does when every named
    property is required, or no other member may appear; with applicators beside them it
    merges schemas first, so that is not known here)."""
    if any(k in sub for k in _APPLICATORS):
        return False
    props = sub.get("properties") or {}
    if set(props) <= set(sub.get("required") or ()):
        return True
    return sub.get("additionalProperties") is False and not sub.get("patternProperties")


@functools.lru_cache(maxsize=1024)
def disjoint_patterns(patterns: tuple[str, ...]) -> bool:
    """Whether llguidance (the one backend that enforces ``patternProperties``) can tell these
    patterns apart: it refuses patterns a member name could match two of."""
    if len(patterns) < 2:
        return True
    import llguidance

    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps({"type": "object", "patternProperties": {p: {} for p in patterns}}))
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    return not (failed and any("not disjoint" in m for m in messages))


def regular(pattern: str) -> bool:
    """False if ``pattern`` has a construct the backends do not read as Python's ``re`` does
    (look-around, ``\\b``, back-references, possessive quantifiers, atomic groups,
    conditionals...: ``regex_superset.py``)."""
    return not constructs(pattern)
