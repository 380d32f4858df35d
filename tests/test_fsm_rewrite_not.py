"""``not`` rewritten exactly (``fsm/schema/algebra/negate.py``, ``fsm/schema/rewrite/negated.py``,
``fsm/schema/algebra/regex_complement.py``), or refused with its path."""

from __future__ import annotations

import re
from typing import Any

import pytest
from rewrite_helpers import assert_equivalent, rewritten

from grammarserve.errors import UnsupportedSchemaError
from grammarserve.fsm.schema.algebra.regex_complement import pattern_complement, words_complement


@pytest.mark.parametrize("schema", [
    {"type": "object", "not": {"required": ["a"]}},
    {"not": {"required": ["a", "b"]}},
    {"properties": {"a": {"not": {"type": "string"}}}},
    {"not": {"type": ["string", "number"]}},
    {"not": {"type": "null"}},
    {"type": "string", "not": {"enum": ["ab", "ac", "b"]}},
    {"not": {"enum": [1, 2.5, True, None, "x"]}},
    {"not": {"const": False}},
    {"not": {"enum": [True, False]}},
    {"type": "integer", "not": {"minimum": 2}},
    {"type": "integer", "not": {"enum": [1, 2, 3]}},
    {"properties": {"a": {"not": {}}}},
    {"anyOf": [{"type": "string"}, {"not": True}]},
    {"type": "number", "not": {"exclusiveMaximum": 2, "minimum": 0}},
    {"not": {"type": "string", "minLength": 2}},
    {"type": "string", "not": {"maxLength": 1}},
    {"type": "array", "not": {"minItems": 1}},
    {"type": "array", "not": {"maxItems": 1}},
    {"type": "object", "not": {"minProperties": 2}},
    {"not": {"type": "array", "items": False}},
    {"type": "array", "not": {"contains": {"const": 1}}},
    {"not": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
    {"not": {"allOf": [{"type": "string"}, {"minLength": 2}]}},
    {"not": {"oneOf": [{"type": "string"}, {"type": "boolean"}]}},
    {"not": {"not": {"type": "string", "maxLength": 1}}},
    {"type": "object", "not": {"properties": {"kind": {"const": "cat"}}, "required": ["kind"]}},
    {"type": "object", "not": {"dependentRequired": {"a": ["b"]}}},
    {"not": {"$ref": "#/$defs/s"}, "$defs": {"s": {"type": "string"}}},
    {"not": {"if": {"type": "string"}, "then": {"minLength": 2}, "else": {"type": "null"}}},
    {"type": "string", "not": {"pattern": "^[Pp][Oo] [Bb]ox"}},
    {"type": "string", "not": {"pattern": "^ab$"}},
    {"type": "string", "not": {"pattern": "^[^a]$"}},
    {"anyOf": [{"not": {"type": "object"}}, {"required": ["a"]}]},
    {"type": "object", "properties": {"a": {}}, "additionalProperties": False,
     "not": {"required": ["a"]}},
    {"type": "object", "properties": {"b": {}}, "additionalProperties": {"type": "integer"},
     "not": {"required": ["a"]}},
])
def test_not_is_rewritten_exactly(schema: dict[str, Any]) -> None:
    assert_equivalent(schema)


def test_integer_gaps_without_integers_are_dropped() -> None:
    out = rewritten({"type": "integer", "not": {"enum": [1, 2]}})
    assert out["anyOf"] == [{"type": "integer", "exclusiveMaximum": 1},
                            {"type": "integer", "exclusiveMinimum": 2}]


def test_property_negating_everything_becomes_false() -> None:
    assert rewritten({"properties": {"a": {"not": {}}}}) == {"properties": {"a": False}}


def test_forbidden_property_is_merged() -> None:
    out = rewritten({"type": "object", "properties": {"b": {"type": "string"}},
                     "not": {"required": ["a"]}})
    assert out == {"type": "object", "properties": {"b": {"type": "string"}, "a": False}}


def test_type_complement_is_one_branch() -> None:
    out = rewritten({"properties": {"a": {"not": {"type": "string"}}}})
    assert out["properties"]["a"] == {"type": ["null", "boolean", "number", "array", "object"]}


def test_negation_restricted_to_the_carrying_type() -> None:
    assert rewritten({"type": "integer", "not": {"minimum": 3}}) == {
        "type": "integer", "exclusiveMaximum": 3}


@pytest.mark.parametrize("schema, why", [
    ({"not": {"type": "integer"}}, "not an integer"),
    ({"type": "string", "not": {"pattern": "a+"}}, "pattern"),
    ({"not": {"multipleOf": 2}}, "multipleOf"),
    ({"not": {"type": "array", "uniqueItems": True}}, "uniqueItems"),
    ({"not": {"enum": [[1]]}}, "array or object"),
    ({"not": {"type": "object", "additionalProperties": False}}, "additionalProperties"),
    ({"not": {"format": "email"}}, "format"),
    ({"not": {"oneOf": [{"type": "string"}, {"minLength": 1}]}}, "oneOf"),
    ({"$defs": {"t": {"anyOf": [{"type": "null"}, {"type": "object", "required": ["a"],
                                                   "properties": {"a": {"$ref": "#/$defs/t"}}}]}},
      "not": {"$ref": "#/$defs/t"}}, "recursive"),
])
def test_not_without_exact_form_is_refused_with_path(schema: dict[str, Any], why: str) -> None:
    with pytest.raises(UnsupportedSchemaError) as info:
        rewritten(schema)
    assert info.value.path == "$.not" and "'not'" in str(info.value)
    assert why in str(info.value)


def test_nested_refusal_names_the_nested_path() -> None:
    with pytest.raises(UnsupportedSchemaError) as info:
        rewritten({"properties": {"a": {"not": {"pattern": "b+"}}}})
    assert info.value.path == "$.properties.a.not"


def test_not_of_everything_is_refused() -> None:
    with pytest.raises(UnsupportedSchemaError, match="excludes every value") as info:
        rewritten({"type": "object", "not": {}})
    assert info.value.path == "$.not"


def test_ref_into_a_not_follows_a_copy() -> None:
    # the target is copied into $defs first (localrefs.hoist_ref_targets), then rewritten
    out = assert_equivalent({"properties": {"a": {"not": {"type": "string"}},
                                            "b": {"$ref": "#/properties/a/not"}}},
                            extra=[{"a": 1, "b": "x"}, {"a": "x"}, {"b": "x"}, {"b": 1}])
    assert out["properties"]["b"]["$ref"].startswith("#/$defs/")


WORDS = ["", "a", "ab", "abc", "b", "a-b", "x.y", "[", "é", "line\nbreak"]


@pytest.mark.parametrize("words", [["ab", "ac", "b"], [""], ["a", ""], ["x.y", "[", "^"],
                                   ["é", "ab\nc"], ["abc", "abd", "abde"]])
def test_words_complement(words: list[str]) -> None:
    pattern = words_complement(words)
    assert pattern is not None
    rx = re.compile(pattern)
    for s in WORDS + words + [w + "z" for w in words] + [w[:-1] for w in words if w]:
        # NOTE: Python's ``$`` also matches before a final newline; the backends' does not
        if not s.endswith("\n"):
            assert (rx.search(s) is not None) == (s not in words), (s, pattern)


@pytest.mark.parametrize("pattern, samples", [
    ("^[Pp][Oo] [Bb]ox", ["PO Box 1", "po box", "PO B", "", "P", "Po bo", "xPO Box"]),
    ("^ab$", ["ab", "abc", "a", "", "b", "xab"]),
    ("^[^a]b", ["xb", "ab", "xbz", "x", "", "b"]),
    (r"^a\.b", ["a.b", "axb", "a.bc", "a."]),
    ("^$", ["", "a"]),
    ("^[0-9a-f]{4}-[0-9]{2}$", ["12ab-34", "12ab-3", "12ab-345", "12aX-34", "12ab_34", ""]),
    ("@\\{", ["", "@", "{", "@{", "x@{y", "@@{", "@x{", "{@"]),
    ("[ ~^:?*\\[\\\\]", ["a b", "ab", "", "x?", "[", "\\", "abc~"]),
    ("abab", ["abab", "ababab", "aabab", "abaab", "aba", "bab", "xabbab"]),
    ("\\{\\{matrix", ["{{matrix}}", "{matrix", "{{{matrix", "{{matri", "a{{matrixb"]),
])
def test_pattern_complement(pattern: str, samples: list[str]) -> None:
    complement = pattern_complement(pattern)
    assert complement is not None
    for s in samples:
        assert (re.search(complement, s) is None) == (re.search(pattern, s) is not None), s


@pytest.mark.parametrize("pattern", ["a+", "a$", "[ab]c", "^a+", "^(a|b)", "^a{2,3}", "^.", r"^\d", "^a|b",
                                     "^", "^a{999}"])
def test_pattern_complement_refuses_what_it_cannot_write(pattern: str) -> None:
    assert pattern_complement(pattern) is None
