"""Value checks, model-free: the front end leaves what no grammar holds (``uniqueItems`` on open
domains, ``contains``, what ``not`` leaves) to checks where that is exact (``fsm/schema/checks/split.py``),
and the streaming JSON tracker finds the values they check (``fsm/json_track.py``)."""

from __future__ import annotations

import json
import random
from typing import Any

import jsonschema
import pytest
from check_helpers import passes, prepared
from check_helpers import values as _values

from grammarserve.errors import UnsupportedSchemaError
from grammarserve.fsm.json_track import JsonTracker
from grammarserve.fsm.schema.prepare import prepare_schema
from grammarserve.fsm.schema.rewrites import rewrite_schema

POOL: list[Any] = [
    None, 0, 1, 2, 3, 1.0, "a", "b", "ab", "abc", "bz", [], ["a"], ["a", "b"], ["a", "a"],
    ["b", "a", "b"], [1, 1.0], [1, 2], [3], [3, 3], [1, 3], [1, 2, 3, 3], [[1], [1]],
    {"tags": ["x", "y"]}, {"tags": ["x", "x"]}, {"tags": []}, {"tags": "x"},
    {"name": "abz"}, {"name": "abc"}, {"name": 1}, {"a": ["p", "p"], "b": ["p", "p"]},
    {"a": ["p", "q"], "b": ["q", "q"]}, {"a": ["p"], "b": ["q", "p"]}, {"x": ["u", "u"]},
    {"x": ["u", "v"]}, {"tags": None}, {"tags": ["x", "y", "x"]}, {"name": "zz", "tags": []},
    {"a": [1], "b": ["x"]}, {"a": ["x"], "b": [2]}, {"a": [1], "b": [2, "y"]}, [[], [[]]],
    [[[1], [2]], [[1], [1]]], [[], []], "bb", "xbbx",
]

EXACT_WITH_CHECKS = [
    {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"},
                                               "uniqueItems": True}}},
    {"type": "object", "properties": {"name": {"type": "string", "not": {"pattern": "^a.*z$"}}}},
    {"$defs": {"S": {"type": "array", "uniqueItems": True}},
     "type": "object", "properties": {"a": {"$ref": "#/$defs/S"}, "b": {"$ref": "#/$defs/S"}}},
    {"type": "object", "properties": {"tags": {"anyOf": [
        {"type": "array", "uniqueItems": True}, {"type": "null"}]}}},
    {"type": "array", "contains": {"const": 3}, "maxContains": 1},
    {"type": "array", "prefixItems": [{"type": "integer"}], "items": {
        "type": "array", "uniqueItems": True}},
    {"type": "object", "properties": {"tags": {}},
     "additionalProperties": {"type": "array", "uniqueItems": True}},
    {"not": {"multipleOf": 2}},
    {"type": "array", "items": {"enum": list(range(8))}, "uniqueItems": True},
    # a oneOf no rewrite holds becomes anyOf + a check, so the not below it is checkable
    {"oneOf": [{"type": "string", "not": {"pattern": "b+"}}, {"type": "integer"}]},
    # a recursion: checked whole where it is entered (here: the document)
    {"$defs": {"t": {"type": "array", "items": {"$ref": "#/$defs/t"}, "uniqueItems": True}},
     "$ref": "#/$defs/t"},
    # an if/then/else whose condition has no exact negation: checked whole
    {"if": {"type": "array", "uniqueItems": True}, "then": {"minItems": 1}},
    # a $ref into a keyword the rewrites remove: its target is copied into $defs first
    {"properties": {"a": {"$ref": "#/properties/b/contains"},
                    "b": {"contains": {"type": "integer"}}}},
    # a $ref to a subschema that is not in $defs: checked at both places
    {"properties": {"a": {"contains": {"type": "integer"}}, "b": {"$ref": "#/properties/a"}}},
]


@pytest.mark.parametrize("schema", EXACT_WITH_CHECKS)
def test_grammar_plus_checks_is_the_schema(schema: dict[str, Any]) -> None:
    out, checks = prepared(schema)
    assert checks, "expected run-time checks"
    assert not any(k in json.dumps(out) for k in ('"uniqueItems": true', '"contains"'))
    original = jsonschema.Draft202012Validator(schema)
    for doc in POOL:
        assert passes(doc, out, checks) == original.is_valid(doc), doc


def test_locations_and_kinds() -> None:
    _, checks = prepared(EXACT_WITH_CHECKS[3])
    assert sorted(c.location for c in checks) == [(("key", "a"),), (("key", "b"),)]
    assert {c.kind for c in checks} == {"unique"}
    _, checks = prepared(EXACT_WITH_CHECKS[6])
    assert [c.location for c in checks] == [(("from", 1),)]
    _, checks = prepared(EXACT_WITH_CHECKS[7])
    assert [c.location for c in checks] == [(("other", ("tags",)),)]
    assert checks[0].matches(("x",)) and not checks[0].matches(("tags",))
    _, checks = prepared(EXACT_WITH_CHECKS[4])
    (c,) = checks
    assert c.kind == "schema" and c.location == (("key", "tags"),)  # the anyOf, checked whole
    (c,) = prepared(EXACT_WITH_CHECKS[5])[1]
    assert c.kind == "contains" and json.loads(c.item_schema) == {"allOf": [{"const": 3}]}
    assert c.where() == "/" and c.schema_path == "$.contains"


@pytest.mark.parametrize("schema", [
    {"type": "integer", "not": {"minimum": 3}},
    {"type": "array", "items": {"enum": ["x", "y"]}, "uniqueItems": True},
    {"properties": {"a": {"not": {"required": ["b"]}}}},
])
def test_what_is_exact_stays_in_the_grammar(schema: dict[str, Any]) -> None:
    out, checks = prepared(schema)
    assert checks == [] and "not" not in json.dumps(out)


@pytest.mark.parametrize("schema, keyword", [
    # a recursion through ``not``: dropping the keyword inside would not widen the whole
    ({"$defs": {"t": {"type": "array", "items": {"not": {"$ref": "#/$defs/t"}},
                      "uniqueItems": True}}, "$ref": "#/$defs/t"}, "not"),
    # a recursion through ``if``
    ({"$defs": {"t": {"type": "array", "uniqueItems": True, "items": {
        "if": {"$ref": "#/$defs/t"}, "then": {"minItems": 1}}}}, "$ref": "#/$defs/t"}, "if"),
])
def test_what_cannot_be_checked_exactly_is_refused(schema: dict[str, Any], keyword: str) -> None:
    with pytest.raises(UnsupportedSchemaError) as info:
        prepared(schema)
    assert info.value.keyword in (keyword, "if")


def test_without_checks_the_keywords_are_refused_as_before() -> None:
    schema = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    with pytest.raises(UnsupportedSchemaError):
        prepare_schema(schema, rewrite=rewrite_schema)
    with pytest.raises(UnsupportedSchemaError, match="contains"):
        prepare_schema({"contains": {"const": 1}}, rewrite=rewrite_schema)


# -- the tracker -------------------------------------------------------------------------------
DOCS = [
    {"a": [1, "x", {"b": None}], "c": -2.5e3, "d": "q\"u\\o\u00e9"},
    [[], {}, [[1]], "", True, False, 0],
    "plain",
    123,
    {"k\"ey": {"n\u00e9": [1, 2, [3, {"z": "}]"}]]}},
]


def _expected(doc: Any) -> list[tuple[tuple[str | int, ...], Any]]:
    return sorted(((p, json.dumps(v)) for p, v in _values(doc)), key=repr)


@pytest.mark.parametrize("doc", DOCS)
@pytest.mark.parametrize("spaced", [False, True])
def test_tracker_reports_every_value_once_whatever_the_chunks(doc: Any, spaced: bool) -> None:
    text = json.dumps(doc, ensure_ascii=False,
                      separators=(", ", ": ") if spaced else (",", ":")).encode()
    rng = random.Random(len(text))
    for _ in range(5):
        tracker, closed, i = JsonTracker(), [], 0
        while i < len(text):
            j = i + rng.randint(1, 4)
            closed += tracker.feed(text[i:j])
            i = j
        closed += tracker.end()
        got = sorted(((c.path, json.dumps(json.loads(text[c.start:c.end]))) for c in closed),
                     key=repr)
        assert got == _expected(doc)
        assert tracker.open_values() == []


def test_tracker_open_values_siblings_and_truncate() -> None:
    t = JsonTracker()
    events = t.feed(b'{"tags": ["a", "b"')
    assert [(e.path, e.siblings) for e in events] == [(("tags", 0), ()),
                                                     (("tags", 1), ((10, 13),))]
    assert t.open_values() == [((), 0), (("tags",), 9)]
    t.truncate(14)  # back to '{"tags": ["a",'
    assert t.open_values() == [((), 0), (("tags",), 9)]
    (item,) = t.feed(b' "c"')
    assert item.path == ("tags", 1) and item.siblings == ((10, 13),)
    (arr,) = t.feed(b"]")
    assert arr.path == ("tags",) and arr.items == ((10, 13), (15, 18))


@pytest.mark.parametrize("parts,prefix", [
    ((), ()), (("a", 0, "b"), ()), (("a", 0, "b"), ("a", "0")), (("a", 0), ("a", 0)),
    (("a", 0), ("a", "1")), (("a",), ("a", "0")), (("$defs", "x", "items"), ("$defs", "y")),
])
def test_text_prefixes_agree_with_starts_with(parts: tuple[Any, ...],
                                              prefix: tuple[Any, ...]) -> None:
    from grammarserve.fsm.schema.checks.paths import starts_with, text_prefixes

    text = tuple(str(p) for p in prefix)
    assert (text in text_prefixes(parts)) is starts_with(parts, prefix) is starts_with(
        tuple(str(p) for p in parts), text)
