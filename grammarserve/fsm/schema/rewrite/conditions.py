"""Conditions as unions of cases, exactly:

- ``if: I, then: T, else: E`` -> ``anyOf: [I and T, not(I) and E]`` (``schema/algebra/negate.py`` writes
  ``not(I)``; without ``then`` it is ``anyOf: [I, E]``, which needs no negation). ``then`` or
  ``else`` without ``if`` mean nothing and are dropped.
- ``dependentRequired: {a: [b, c]}`` -> one case per set of trigger keys present: those keys
  and their dependents required, the other triggers forbidden (``properties: {t: false}``).
  The cases are disjoint; more than :data:`MAX_CASES` are refused with a message.
- ``dependencies`` (drafts 4-7) with only array values is read as ``dependentRequired``. Draft
  2020-12 ignores ``dependencies``; enforcing it can only narrow what is generated.
- ``allOf`` members ``{if: {properties: {k: {const: c_i}}}, then: T_i, else: E_i}`` that
  switch on one key ``k`` (distinct ``c_i``; all with ``required: [k]`` in the condition or
  none) -> one ``anyOf`` of the cases: ``k`` is ``c_i`` (``T_i`` and every other ``E_j``),
  ``k`` is none of them (every ``E_j``), ``k`` is absent (every ``E_j``, or every ``T_j`` when
  the conditions do not require ``k``), not an object (every ``T_j``). Linear in the members,
  where one ``anyOf`` per member makes backends intersect 2**n cases.
- ``dependentSchemas: {k: S}`` -> ``anyOf: [{properties: {k: false}}, {required: [k]} and S]``
  (``k`` absent, or present and ``S`` holds; a non-object passes the first case, as it passes
  ``dependentSchemas``), one such ``anyOf`` per key.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

from grammarserve.errors import UnsupportedSchemaError
from grammarserve.fsm.schema.algebra.negate import Negator
from grammarserve.fsm.schema.algebra.typed_union import Unexpressible, domains_of, emit, restrict
from grammarserve.fsm.schema.rewrite.negated import Leftover, attach, combine, refuse_if_referenced
from grammarserve.fsm.schema.tree import iter_refs, iter_subschemas, json_path, pointer

#: At most this many cases for one ``dependentRequired``.
MAX_CASES = 64
#: At most this many trigger keys are enumerated (2**n subsets).
_MAX_TRIGGERS = 12


def rewrite_conditions(schema: dict[str, Any], leftover: Leftover | None = None, *,
                       prefer: bool = False) -> dict[str, Any]:
    """Rewrite every ``if``/``then``/``else`` of ``schema`` (in place); raise
    :class:`UnsupportedSchemaError` at the first one whose condition has no exact negation,
    unless ``leftover`` takes it (a run-time check of the whole condition); with ``prefer``,
    ``leftover`` is offered each condition first."""
    negator = Negator(schema)
    for sub, parts in reversed(list(iter_subschemas(schema))):
        if "if" not in sub and "then" not in sub and "else" not in sub:
            continue
        if "if" not in sub:
            for key in ("then", "else"):
                if key in sub:
                    refuse_if_referenced(schema, parts + (key,), key)
                    del sub[key]
            continue
        if prefer and leftover is not None and leftover(parts, "if"):
            continue
        for key in ("if", "then", "else"):
            refuse_if_referenced(schema, parts + (key,), key)
        cond, then, other = sub["if"], sub.get("then", True), sub.get("else", True)
        if then in (True, {}) and other in (True, {}):
            cases: list[Any] = [True]
        elif then in (True, {}):
            cases = [cond, other]  # I or (not I and E) == I or E
        else:
            where = json_path(parts + ("if",))
            try:
                negated = emit(restrict(negator.negative(cond), domains_of(sub.get("type"))))
            except Unexpressible as e:
                if leftover is not None and leftover(parts, "if"):
                    continue
                raise UnsupportedSchemaError(
                    f"unsupported keyword 'if' at {where}: the condition has no exact negation "
                    f"({e}), so if/then/else cannot be enforced; use 'anyOf' of the cases",
                    path=where, keyword="if") from None
            cases = [combine(cond, then), combine(negated, other)]
        for key in ("if", "then", "else"):
            sub.pop(key, None)
        cases = [c for c in cases if c is not False]
        if not cases:
            raise UnsupportedSchemaError(
                f"'if' at {json_path(parts + ('if',))}: no value satisfies either case",
                path=json_path(parts + ("if",)), keyword="if")
        if any(c is True or c == {} for c in cases):
            continue
        attach(sub, cases[0] if len(cases) == 1 else {"anyOf": cases})
    return schema


_NOTES = frozenset({"$comment", "description", "title"})
_OTHER_TYPES = ["null", "boolean", "number", "string", "array"]


def rewrite_switches(schema: dict[str, Any]) -> dict[str, Any]:
    """Rewrite the ``allOf`` members that switch on one key into one ``anyOf`` (in place; see
    the module docstring)."""
    for sub, parts in list(iter_subschemas(schema)):
        members = sub.get("allOf")
        if not isinstance(members, list) or len(members) < 2:
            continue
        for key, picked in _switches(members).items():
            if len(picked) < 2 or any(_referenced(schema, parts + ("allOf", i))
                                      for i in picked):
                continue
            cases = _switch_cases(sub, key, [members[i] for i in picked])
            if cases is None:
                continue
            sub["allOf"] = [m for i, m in enumerate(members) if i not in picked] + [
                {"anyOf": cases}]
            break  # the member indices changed: one switch per node and pass
    return schema


def _switches(members: list[Any]) -> dict[str, list[int]]:
    """Key -> indices of the members that are ``if`` on that key's ``const``."""
    out: dict[str, list[int]] = {}
    for i, m in enumerate(members):
        found = _condition(m)
        if found is not None:
            out.setdefault(found[0], []).append(i)
    return out


def _condition(member: Any) -> tuple[str, Any, bool] | None:
    """(key, value, requires the key) of ``{if: {properties: {key: {const: value}}}, ...}``."""
    if not isinstance(member, dict) or "if" not in member or \
            not set(member) <= {"if", "then", "else"} | _NOTES:
        return None
    cond = member["if"]
    if not isinstance(cond, dict) or not set(cond) <= {"properties", "required"} | _NOTES:
        return None
    props = cond.get("properties")
    if not isinstance(props, dict) or len(props) != 1:
        return None
    (key, test), = props.items()
    required = cond.get("required", [])
    if required not in ([], [key]) or not isinstance(test, dict):
        return None
    if set(test) - _NOTES == {"const"}:
        return key, test["const"], bool(required)
    if set(test) - _NOTES == {"enum"} and isinstance(test["enum"], list) \
            and len(test["enum"]) == 1:
        return key, test["enum"][0], bool(required)
    return None


def _switch_cases(node: dict[str, Any], key: str, members: list[dict[str, Any]]
                  ) -> list[Any] | None:
    conds = [_condition(m) for m in members]
    values = [c[1] for c in conds if c is not None]
    requires = {c[2] for c in conds if c is not None}
    if len(requires) != 1 or any(not isinstance(v, (str, int, bool)) or v is None
                                 for v in values) or len(set(map(repr, values))) != len(values):
        return None
    thens = [m.get("then", True) for m in members]
    elses = [m.get("else", True) for m in members]

    def both(extra: dict[str, Any], parts: list[Any]) -> Any:
        kept = [p for p in parts if p is not True and p != {}]
        if any(p is False for p in kept):
            return False
        return {**extra, "allOf": kept} if kept else extra

    cases: list[Any] = [
        both({"type": "object", "required": [key], "properties": {key: {"const": v}}},
             [thens[i]] + [e for j, e in enumerate(elses) if j != i])
        for i, v in enumerate(values)]
    cases.append(both({"type": "object", "required": [key],
                       "properties": {key: {"not": {"enum": values}}}}, elses))
    if key not in (node.get("required") or ()):
        cases.append(both({"type": "object", "properties": {key: False}},
                          elses if requires == {True} else thens))
    if node.get("type") not in ("object", ["object"]):
        cases.append(both({"type": _OTHER_TYPES}, thens))
    return [c for c in cases if c is not False]


def _referenced(root: dict[str, Any], parts: tuple[str | int, ...]) -> bool:

    prefix = pointer(parts)
    return any(s["$ref"] == prefix or s["$ref"].startswith(prefix + "/")
               for s, _ in iter_refs(root))


def rewrite_dependencies(schema: dict[str, Any], prefer: Leftover | None = None
                         ) -> dict[str, Any]:
    """Rewrite every ``dependentRequired`` (and array-only ``dependencies``) of ``schema``
    into cases (in place), unless ``prefer`` takes it (a run-time check instead)."""
    for sub, parts in reversed(list(iter_subschemas(schema))):
        deps = sub.get("dependencies")
        if isinstance(deps, dict) and all(isinstance(v, list) for v in deps.values()):
            merged = dict(sub.get("dependentRequired") or {})
            for key, needs in deps.items():
                merged[key] = list(dict.fromkeys(list(merged.get(key, [])) + needs))
            del sub["dependencies"]
            sub["dependentRequired"] = merged
        if "dependentRequired" not in sub or (prefer is not None
                                              and prefer(parts, "dependentRequired")):
            continue
        where = json_path(parts + ("dependentRequired",))
        cases = dependency_cases(sub.pop("dependentRequired"), where)
        if cases:
            attach(sub, cases[0] if len(cases) == 1 else {"anyOf": cases})
    return schema


def rewrite_dependent_schemas(schema: dict[str, Any], prefer: Leftover | None = None
                              ) -> dict[str, Any]:
    """Rewrite every ``dependentSchemas`` of ``schema`` into cases (in place), unless
    ``prefer`` takes it."""
    for sub, parts in reversed(list(iter_subschemas(schema))):
        deps = sub.get("dependentSchemas")
        if not isinstance(deps, dict) or (prefer is not None
                                          and prefer(parts, "dependentSchemas")):
            continue
        refuse_if_referenced(schema, parts + ("dependentSchemas",), "dependentSchemas")
        del sub["dependentSchemas"]
        for key, dependent in deps.items():
            if dependent is True or dependent == {}:
                continue
            present = combine({"required": [key]}, dependent)
            attach(sub, {"anyOf": [{"properties": {key: False}}, present]})
    return schema


def dependency_cases(deps: dict[str, list[str]], where: str = "$") -> list[dict[str, Any]]:
    """The disjoint cases of ``dependentRequired: deps`` (``[]``: no constraint)."""
    needs = {k: [d for d in v if d != k] for k, v in deps.items()}
    triggers = [k for k, v in needs.items() if v]
    if len(triggers) > _MAX_TRIGGERS:
        raise _too_many(where, f"{len(triggers)} keys have dependents")
    cases: list[dict[str, Any]] = []
    for n in range(len(triggers) + 1):
        for present in combinations(triggers, n):
            absent = [t for t in triggers if t not in present]
            # NOTE: dependents before their trigger: a backend generates keys that
            # ``properties`` does not list in ``required`` order, and instances usually give
            # the key that needs others last
            required = list(dict.fromkeys(
                [k for t in present for k in needs[t] + [t]]))
            if set(required) & set(absent):
                continue  # a dependent is itself an absent trigger: impossible case
            case: dict[str, Any] = {}
            if required:
                case["required"] = required
            if absent:
                case["properties"] = {t: False for t in absent}
            cases.append(case)
            if len(cases) > MAX_CASES:
                raise _too_many(where, f"more than {MAX_CASES} cases")
    return cases if len(triggers) else []


def _too_many(where: str, why: str) -> UnsupportedSchemaError:
    return UnsupportedSchemaError(
        f"unsupported keyword 'dependentRequired' at {where}: {why}; the grammar enforces it "
        f"as one case per combination of keys present, at most {MAX_CASES}",
        path=where, keyword="dependentRequired")
