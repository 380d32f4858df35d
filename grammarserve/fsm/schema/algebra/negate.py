"""Exact negation of a JSON schema: ``not: S`` as a schema without ``not``.

:func:`negative` and :func:`positive` turn a schema into :data:`~typed_union.Parts` (a union
of per-type alternatives), recursing through ``allOf`` (De Morgan: a union of negations),
``anyOf`` (an intersection of negations), provably disjoint ``oneOf`` (an ``anyOf``), local
``$ref``s, ``if``/``then``/``else`` and nested ``not`` (double negation). Per keyword:

- ``type``: the other types; ``required`` of a key: that key forbidden (``properties: {k:
  false}``); ``properties``: that key present with the negated value; ``dependentRequired``;
- bounds flip (``minLength: 3`` -> ``maxLength: 2``, ``minimum: 0`` -> ``exclusiveMaximum:
  0``, ``minItems``, ``minProperties`` ...);
- ``enum``/``const`` of scalars: the other types, the numbers between the excluded points,
  the other boolean, and a string pattern that is the regular complement of the strings;
- ``pattern``: the complement when it is a fixed sequence of characters and classes;
- ``contains`` (alone): ``items`` of the negation.

What has no exact form (``multipleOf``, ``format``, ``uniqueItems``, ``additionalProperties``,
``patternProperties``, ``propertyNames``, a general ``pattern``, objects or arrays in
``enum``, "a number that is not an integer", recursive ``$ref``s) raises
:class:`~typed_union.Unexpressible` naming the keyword.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import jsonschema

from grammarserve.fsm.schema.algebra.disjoint import pairwise_disjoint
from grammarserve.fsm.schema.algebra.regex_complement import pattern_complement, words_complement
from grammarserve.fsm.schema.algebra.typed_union import (
    DOMAINS,
    Alt,
    Parts,
    Unexpressible,
    domains_of,
    emit,
    everything,
    intersect,
    union,
)
from grammarserve.fsm.schema.tree import resolve_pointer

ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment",
                         "deprecated", "readOnly", "writeOnly", "$schema", "$anchor",
                         "contentEncoding", "contentMediaType", "contentSchema", "format",
                         "$defs", "definitions", "discriminator"})
_STRING = frozenset({"minLength", "maxLength", "pattern"})
_NUMBER = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                     "multipleOf"})
_ARRAY = frozenset({"items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains",
                    "minContains", "maxContains"})
_OBJECT = frozenset({"properties", "required", "additionalProperties", "patternProperties",
                     "minProperties", "maxProperties", "propertyNames", "dependentRequired",
                     "dependentSchemas"})
_BY_DOMAIN = {"string": _STRING, "integer": _NUMBER, "fraction": _NUMBER, "array": _ARRAY,
              "object": _OBJECT, "null": frozenset(), "boolean": frozenset()}
_STRUCTURE = frozenset({"type", "enum", "const", "allOf", "anyOf", "oneOf", "$ref", "not",
                        "if", "then", "else"})
_FLIP = {"minimum": "exclusiveMaximum", "maximum": "exclusiveMinimum",
         "exclusiveMinimum": "maximum", "exclusiveMaximum": "minimum"}
#: Depth of nested ``$ref``s followed (a recursive one is refused).
_MAX_REFS = 16


class Negator:
    """Negates subschemas of ``root`` (whose local ``$ref``s it follows)."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self._refs: list[str] = []

    # -- whole schemas ---------------------------------------------------------------------
    def negative(self, schema: Any) -> Parts:
        """The values ``schema`` rejects."""
        if schema is True:
            return {}
        if schema is False:
            return everything()
        if not isinstance(schema, dict):
            raise Unexpressible("not", "not a schema")
        self._check_keys(schema)
        parts = [self._negative_own(schema)]
        parts += [self.negative(m) for m in _list(schema, "allOf")]
        if "anyOf" in schema:
            parts.append(intersect(*(self.negative(m) for m in _list(schema, "anyOf"))))
        if "oneOf" in schema:
            parts.append(intersect(*(self.negative(m) for m in self._one_of(schema))))
        if "$ref" in schema:
            parts.append(self._follow(schema["$ref"], self.negative))
        if "not" in schema:
            parts.append(self.positive(schema["not"]))
        if "if" in schema:
            parts.append(self._condition(schema, negate=True))
        return union(*parts)

    def positive(self, schema: Any) -> Parts:
        """The values ``schema`` accepts."""
        if schema is True:
            return everything()
        if schema is False:
            return {}
        if not isinstance(schema, dict):
            raise Unexpressible("not", "not a schema")
        self._check_keys(schema)
        parts = [self._positive_own(schema)]
        parts += [self.positive(m) for m in _list(schema, "allOf")]
        if "anyOf" in schema:
            parts.append(union(*(self.positive(m) for m in _list(schema, "anyOf"))))
        if "oneOf" in schema:
            parts.append(union(*(self.positive(m) for m in self._one_of(schema))))
        if "$ref" in schema:
            parts.append(self._follow(schema["$ref"], self.positive))
        if "not" in schema:
            parts.append(self.negative(schema["not"]))
        if "if" in schema:
            parts.append(self._condition(schema, negate=False))
        return intersect(*parts)

    def negated_schema(self, schema: Any) -> Any:
        """``not: schema`` as a schema without ``not``."""
        return emit(self.negative(schema))

    # -- pieces ----------------------------------------------------------------------------
    def _check_keys(self, schema: dict[str, Any]) -> None:
        for key in schema:
            if key not in ANNOTATIONS | _STRUCTURE and not any(
                    key in kw for kw in _BY_DOMAIN.values()):
                if key.startswith("x-") or key in ("$id",):
                    if key == "$id":
                        raise Unexpressible(key, "a nested '$id' cannot be moved")
                    continue
                raise Unexpressible(key, "it has no exact negation")
            if key == "format":
                raise Unexpressible(key, "an asserted 'format' has no exact negation")

    def _one_of(self, schema: dict[str, Any]) -> list[Any]:
        branches = _list(schema, "oneOf")
        if not pairwise_disjoint(self.root, branches):
            raise Unexpressible("oneOf", "its branches are not provably disjoint")
        return branches

    def _follow(self, ref: Any, how: Callable[[Any], Parts]) -> Parts:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise Unexpressible("$ref", "only local references are followed")
        if ref in self._refs or len(self._refs) >= _MAX_REFS:
            raise Unexpressible("$ref", "a recursive reference has no finite negation")
        try:
            target = resolve_pointer(self.root, ref)
        except (KeyError, ValueError, IndexError):
            raise Unexpressible("$ref", f"{ref!r} does not resolve") from None
        self._refs.append(ref)
        try:
            result = how(target)
        finally:
            self._refs.pop()
        return result

    def _condition(self, schema: dict[str, Any], *, negate: bool) -> Parts:
        cond = schema["if"]
        then, other = schema.get("then", True), schema.get("else", True)
        side = self.negative if negate else self.positive
        return union(intersect(self.positive(cond), side(then)),
                     intersect(self.negative(cond), side(other)))

    def _values(self, schema: dict[str, Any]) -> list[Any] | None:
        """The finite set of values ``schema`` accepts, if it has ``enum``/``const``."""
        if "const" in schema:
            values = [schema["const"]]
        elif isinstance(schema.get("enum"), list):
            values = list(schema["enum"])
        else:
            return None
        rest = {k: v for k, v in schema.items() if k not in ("enum", "const")}
        if set(rest) - ANNOTATIONS:
            if any(k in rest for k in ("$ref", "$dynamicRef")):
                raise Unexpressible("enum", "'enum' next to '$ref' is not negated")
            check = jsonschema.Draft202012Validator(rest)
            values = [v for v in values if check.is_valid(v)]
        return values

    def _negative_own(self, schema: dict[str, Any]) -> Parts:
        values = self._values(schema)
        if values is not None:
            return _not_values(values)
        allowed = domains_of(schema.get("type"))
        out: Parts = {}
        for d in DOMAINS:
            if d not in allowed:
                out[d] = [{}]
                continue
            alts: list[Alt] = []
            for key in _BY_DOMAIN[d] & set(schema):
                alts.extend(self._negate_keyword(schema, key))
            if alts:
                out[d] = alts
        return union(out)

    def _positive_own(self, schema: dict[str, Any]) -> Parts:
        values = self._values(schema)
        if values is not None:
            return _values_parts(values)
        out: Parts = {}
        for d in domains_of(schema.get("type")):
            out[d] = [{k: schema[k] for k in _BY_DOMAIN[d] if k in schema}]
        return out

    def _negate_keyword(self, schema: dict[str, Any], key: str) -> list[Alt]:
        value = schema[key]
        if key in ("minLength", "minItems", "minProperties"):
            upper = key.replace("min", "max")
            return [{upper: value - 1}] if value > 0 else []
        if key in ("maxLength", "maxItems", "maxProperties"):
            return [{key.replace("max", "min"): value + 1}]
        if key in _FLIP:
            return [{_FLIP[key]: value}]
        if key == "pattern":
            complement = pattern_complement(value)
            if complement is None:
                raise Unexpressible(key, f"the complement of {value!r} is not written as a "
                                         "pattern (only '^' then fixed characters or classes)")
            return [{"pattern": complement}]
        if key == "required":
            return [{"properties": {k: False}} for k in value]
        if key == "properties":
            return self._negate_properties(value)
        if key == "dependentRequired":
            return [{"required": [k], "properties": {dep: False}}
                    for k, deps in value.items() for dep in deps if dep != k]
        if key == "uniqueItems" and value is False:
            return []
        if key == "contains" and not {"minContains", "maxContains"} & set(schema):
            return [{"items": self.negated_schema(value)}]
        if key in ("items", "additionalProperties") and value in (True, {}):
            return []
        if key in ("items", "prefixItems") and "prefixItems" not in schema and value is False:
            return [{"minItems": 1}]
        if key in ("patternProperties", "dependentSchemas") and value == {}:
            return []
        raise Unexpressible(key, "it has no exact negation")

    def _negate_properties(self, props: dict[str, Any]) -> list[Alt]:
        alts: list[Alt] = []
        for name, sub in props.items():
            negated = self.negated_schema(sub)
            if negated is not False:
                alts.append({"required": [name], "properties": {name: negated}})
        return alts


def _list(schema: dict[str, Any], key: str) -> list[Any]:
    value = schema.get(key)
    return value if isinstance(value, list) else []


def _by_domain(values: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {d: [] for d in DOMAINS}
    for v in values:
        if v is None:
            out["null"].append(v)
        elif isinstance(v, bool):
            out["boolean"].append(v)
        elif isinstance(v, (int, float)):
            out["integer"].append(v)  # numbers: kept under one key here
        elif isinstance(v, str):
            out["string"].append(v)
        elif isinstance(v, list):
            out["array"].append(v)
        else:
            out["object"].append(v)
    return out


def _values_parts(values: list[Any]) -> Parts:
    """Exactly ``values``, per domain."""
    groups = _by_domain(values)
    out: Parts = {}
    if groups["null"]:
        out["null"] = [{}]
    bools = set(groups["boolean"])
    if bools:
        out["boolean"] = [{}] if len(bools) == 2 else [{"const": bools.pop()}]
    for d, key in (("integer", "integer"), ("integer", "fraction"), ("string", "string"),
                   ("array", "array"), ("object", "object")):
        if groups[d]:
            out[key] = [{"enum": groups[d]}]
    return out


def _not_values(values: list[Any]) -> Parts:
    """Every value not in ``values`` (scalars only)."""
    groups = _by_domain(values)
    if groups["array"] or groups["object"]:
        raise Unexpressible("enum", "the complement of array or object values is not "
                                    "expressible")
    out: Parts = {d: [{}] for d in ("array", "object")}
    if not groups["null"]:
        out["null"] = [{}]
    bools = set(groups["boolean"])
    if len(bools) < 2:
        out["boolean"] = [{"const": not bools.pop()}] if bools else [{}]
    points = sorted(set(groups["integer"]))
    if points:
        gaps: list[Alt] = [{"exclusiveMaximum": points[0]}]
        gaps += [{"exclusiveMinimum": lo, "exclusiveMaximum": hi}
                 for lo, hi in itertools.pairwise(points)]
        gaps.append({"exclusiveMinimum": points[-1]})
        out["integer"] = out["fraction"] = gaps
    else:
        out["integer"] = out["fraction"] = [{}]
    if groups["string"]:
        pattern = words_complement(groups["string"])
        if pattern is None:
            raise Unexpressible("enum", "the complement of these strings is too long")
        out["string"] = [{"pattern": pattern}]
    else:
        out["string"] = [{}]
    return out
