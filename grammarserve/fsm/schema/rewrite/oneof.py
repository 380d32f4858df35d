"""``oneOf`` whose branches may overlap -> ``anyOf`` of exclusive cases, exactly.

"Exactly one of B1..Bn" is the union over i of "Bi and not Bj for every j != i". When every
branch has an exact negation (``schema/algebra/negate.py``; restricted to the carrying subschema's ``type``),
this is a plain ``anyOf`` the backends enforce. Cases no value can satisfy are dropped. At most
:data:`MAX_BRANCHES` branches are expanded; otherwise, or when a negation has no exact form,
the ``oneOf`` is left for the backend (which refuses it unless it proves the branches
disjoint itself).
"""

from __future__ import annotations

import copy
from typing import Any

from grammarserve.fsm.schema.algebra.negate import Negator
from grammarserve.fsm.schema.algebra.typed_union import Unexpressible, domains_of, emit, restrict
from grammarserve.fsm.schema.rewrite.negated import attach, combine
from grammarserve.fsm.schema.tree import iter_subschemas

#: At most this many ``oneOf`` branches are expanded (each case holds n - 1 negations).
MAX_BRANCHES = 6


def rewrite_oneof_cases(schema: dict[str, Any]) -> dict[str, Any]:
    """Rewrite every remaining ``oneOf`` of ``schema`` that has exact cases (in place)."""
    negator = Negator(schema)
    for sub, _ in reversed(list(iter_subschemas(schema))):
        if not isinstance(sub.get("oneOf"), list):
            continue
        cases = exclusive_cases(negator, sub)
        if cases is None or not cases:
            continue  # no exact form, or no value at all: the backend says so
        del sub["oneOf"]
        attach(sub, cases[0] if len(cases) == 1 else {"anyOf": cases})
    return schema


def exclusive_cases(negator: Negator, sub: dict[str, Any]) -> list[Any] | None:
    """The cases of ``sub["oneOf"]`` (``None`` if some branch has no exact negation)."""
    branches = sub["oneOf"]
    if len(branches) > MAX_BRANCHES:
        return None
    domains = domains_of(sub.get("type"))
    try:
        negations = [emit(restrict(negator.negative(b), domains)) for b in branches]
    except Unexpressible:
        return None
    cases: list[Any] = []
    for i, branch in enumerate(branches):
        case = copy.deepcopy(branch)
        for j, negation in enumerate(negations):
            if j != i:
                case = combine(case, negation)
        if case is True or case == {}:
            return [True]
        if case is not False:
            cases.append(case)
    return cases
