"""The keywords no grammar holds beyond ``uniqueItems``/``contains``/``not``, model-free:
``unevaluated*``, ``oneOf`` that no rewrite holds, ``propertyNames``, ``min/maxProperties``
llguidance cannot count, irregular patterns, overlapping ``patternProperties``, conditions
without an exact negation (``fsm/schema/checks/plan.py``), the exact rewrites beside them
(``schema/rewrite/unevaluated.py``, ``dependentSchemas``), and where their checks are anchored
(``schema/checks/split.py``: ``$ref``s to any subschema, recursion)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from check_helpers import passes, prepared

from grammarserve.errors import GrammarError
from grammarserve.fsm.conformance import load_suite
from grammarserve.fsm.schema.checks.plan import counts_members, regular
from grammarserve.fsm.schema.tree import iter_subschemas

SUITE = Path(__file__).resolve().parent / "data" / "json-schema-test-suite" / "draft2020-12"
#: Valid instances the pair refuses on purpose: a custom meta-schema we do not fetch.
DOCUMENTED = {("vocabulary.json",
               "schema that uses custom metaschema with with no validation vocabulary")}


def test_the_suite_grammar_plus_checks_is_each_schema() -> None:
    """Every suite schema the front end takes (``format`` aside: asserted by the grammar, an
    annotation to the suite) accepts exactly the suite's valid instances."""
    taken = 0
    wrong = []
    for case in load_suite(SUITE):
        if case.file == "format.json":
            continue
        try:
            out, checks = prepared(case.schema)
        except GrammarError:
            continue
        taken += 1
        for desc, instance, valid in case.tests:
            if passes(instance, out, checks) != valid and (case.file, case.description) \
                    not in DOCUMENTED:
                wrong.append(f"{case.file} | {case.description} | {desc} (valid={valid})")
    assert wrong == []
    # of 364; the rest: remote refs, custom meta-schemas (vocabulary.json's two: refused, as
    # their vocabularies decide which keywords assert), no instance
    assert taken >= 339


POOL: list[Any] = [
    None, 0, 1, 7, "a", "ab", "abc", "abcd", [], [1], [1, 1], [1, 2], ["a", "b"], [1, "x"],
    {}, {"a": 1}, {"b": 1}, {"a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3}, {"ab": 1},
    {"abcd": 1}, {"x1": 1}, {"x1": "s"}, {"y": 1}, {"a": "s"}, {"a": {"a": {}}},
    {"a": {"a": {"z": 1}}}, {"n": [{"n": []}, {"n": [1, 1]}]}, {"n": [{"n": [{"n": []}]}]},
    {"n": [{"n": [{"n": [], "m": 1}]}]},
]

EXACT = [
    # unevaluated*: without applicators exactly additionalProperties / items
    {"properties": {"a": {}}, "unevaluatedProperties": False},
    {"prefixItems": [{"type": "integer"}], "unevaluatedItems": {"type": "string"}},
    # with them, a check of the whole
    {"allOf": [{"properties": {"a": {}}}], "unevaluatedProperties": False},
    {"anyOf": [{"prefixItems": [{"type": "integer"}]}], "unevaluatedItems": False},
    # oneOf whose branches overlap and have no exact negation
    {"oneOf": [{"type": "array", "uniqueItems": True}, {"type": "array", "minItems": 2}]},
    {"propertyNames": {"maxLength": 2}},
    {"type": "object", "properties": {"a": {}, "b": {}}, "maxProperties": 1},
    {"type": "string", "pattern": "^(?!ab)"},
    {"patternProperties": {"^a": {"type": "integer"}, "^ab": {"maximum": 1}}},
    {"patternProperties": {"^(?!a)": {"type": "integer"}}, "additionalProperties": False},
    {"dependentSchemas": {"a": {"required": ["b"]}}},
    # a recursive object whose arrays must hold distinct items, at any depth
    {"$defs": {"n": {"type": "object", "properties": {"n": {
        "type": "array", "items": {"$ref": "#/$defs/n"}, "uniqueItems": True}}}},
     "$ref": "#/$defs/n"},
    # a $ref from a keyword no draft defines still counts where the checks go
    {"$defs": {"u": {"type": "array", "uniqueItems": True}},
     "properties": {"a": {"$ref": "#/x-lib/wrap"}}, "x-lib": {"wrap": {"$ref": "#/$defs/u"}}},
]


@pytest.mark.parametrize("schema", EXACT, ids=lambda s: json.dumps(s)[:60])
def test_grammar_plus_checks_is_the_schema(schema: dict[str, Any]) -> None:
    out, checks = prepared(schema)
    original = jsonschema.Draft202012Validator(schema)
    for doc in POOL:
        assert passes(doc, out, checks) == original.is_valid(doc), (doc, out, checks)


def test_exact_rewrites_need_no_check() -> None:
    for schema in EXACT[:2] + [EXACT[10]]:
        out, checks = prepared(schema)
        assert checks == [] and "unevaluated" not in json.dumps(out)


def test_one_of_becomes_any_of_and_refs_follow() -> None:
    schema = {"oneOf": [{"type": "array", "uniqueItems": True},
                        {"type": "array", "minItems": 2}],
              "properties": {"p": {"$ref": "#/oneOf/1"}}}
    out, checks = prepared(schema)
    assert "oneOf" not in json.dumps(out) and out["properties"]["p"]["$ref"] == "#/$defs/hoisted_0"
    assert "oneOf" in {c.keyword for c in checks}
    assert all(c.location == () for c in checks)


def test_recursion_is_checked_where_it_is_entered() -> None:
    _, checks = prepared(EXACT[11])
    assert [(c.location, c.kind) for c in checks] == [((), "schema")]
    schema = {"$defs": {"n": EXACT[11]["$defs"]["n"]}, "properties": {"t": {"$ref": "#/$defs/n"}}}
    _, checks = prepared(schema)
    assert [c.location for c in checks] == [(("key", "t"),)]


def test_which_counts_llguidance_enforces() -> None:
    assert counts_members({"minProperties": 1})
    assert counts_members({"properties": {"a": {}}, "required": ["a"], "maxProperties": 2})
    assert counts_members({"properties": {"a": {}}, "additionalProperties": False,
                           "maxProperties": 2})
    assert not counts_members({"properties": {"a": {}}, "maxProperties": 2})
    assert not counts_members({"allOf": [{"properties": {"a": {}}}], "maxProperties": 2})


@pytest.mark.parametrize("pattern, ok", [
    ("^[a-z]+$", True), (r"\(?=x", True), ("[(?=]", True), (r"\d{2}", True), (r"[\b]", True),
    ("(?=a)", False), ("(?!a)", False), ("(?<=a)b", False), ("(?<!a)b", False),
    (r"(a)\1", False), (r"\bword", False), ("(?>a)", False), (r"(?<n>a)\k<n>", False),
])
def test_regular_patterns(pattern: str, ok: bool) -> None:
    assert regular(pattern) is ok


def test_trivial_property_names_are_dropped() -> None:
    out, checks = prepared({"type": "object", "propertyNames": {"type": "string"}})
    assert checks == [] and "propertyNames" not in out


def test_overlapping_pattern_properties_fold_into_additional() -> None:
    out, checks = prepared({"patternProperties": {"^x": {"type": "integer"}, "^x1": {}},
                            "additionalProperties": {"type": "string"}})
    assert "patternProperties" not in out and [c.keyword for c in checks] == [
        "patternProperties"]
    assert out["additionalProperties"] is True
    disjoint, checks = prepared({"patternProperties": {"^x": {}, "^y": {}}})
    assert checks == [] and "patternProperties" in disjoint


def test_no_keyword_is_left_for_a_backend_to_ignore() -> None:
    for schema in EXACT:
        out, _ = prepared(schema)
        left = {k for sub, _ in iter_subschemas(out) for k in sub} & {
            "unevaluatedProperties", "unevaluatedItems", "oneOf", "propertyNames",
            "dependentSchemas", "uniqueItems", "if"}
        assert not left, (schema, out)
