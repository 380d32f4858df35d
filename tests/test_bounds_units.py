"""Issue 20, the grammar layer's bounds without a model: schemas with no instance (or a part
that can never be completed) refused naming the keyword or the ``$ref``, grammar rules that can
never be completed, nesting measured without recursion, and the byte-bounded memo."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import xgrammar as xgr

from grammarserve.errors import GrammarError, SchemaValidationError
from grammarserve.fsm.lru import BoundedLRU
from grammarserve.fsm.schema.algebra.finite import check_finite
from grammarserve.fsm.schema.depth import check_schema_depth, paren_depth, text_depth, value_depth
from grammarserve.fsm.schema.prepare import prepare_schema
from grammarserve.fsm.text_finite import check_grammar_productive, unproductive_rules
from grammarserve.fsm.text_grammars import check_lark, check_regex
from grammarserve.openai.protocol import has_lone_surrogate

REPO = Path(__file__).resolve().parents[1]
NODE = {"type": "object", "properties": {"y": {"$ref": "#/$defs/a"}}, "required": ["y"]}

# (schema, JSON path of the refusal, words of the message)
NO_INSTANCE: list[tuple[Any, str, str]] = [
    ({"type": "string", "allOf": [{"type": "integer"}]}, "$.type",
     "'type' allows string; allOf[0] allows integer"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "$.allOf",
     "allOf[0] allows string; allOf[1] allows integer"),
    ({"enum": []}, "$.enum", "'enum' is empty"),
    ({"type": "string", "enum": [1, None]}, "$.enum", "none of its 2 'enum' values"),
    ({"type": "string", "const": 1}, "$.const", "1 is not of type 'string'"),
    ({"type": "array", "minItems": 5, "maxItems": 2}, "$.minItems",
     "minItems (5) is greater than maxItems (2)"),
    ({"type": "string", "minLength": 5, "maxLength": 2}, "$.minLength", "minLength (5)"),
    ({"type": "integer", "minimum": 5, "maximum": 2}, "$.minimum", "no integer satisfies"),
    ({"type": "integer", "exclusiveMinimum": 2, "exclusiveMaximum": 3}, "$.exclusiveMinimum",
     "no integer satisfies"),
    ({"type": "integer", "minimum": 1, "maximum": 5, "multipleOf": 7}, "$.multipleOf",
     "no multiple of 7"),
    ({"type": "object", "maxProperties": 0, "required": ["a"]}, "$.maxProperties",
     "maxProperties (0)"),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"],
      "additionalProperties": False}, "$.required", "'b' is not allowed"),
    ({"type": "object", "additionalProperties": {"$ref": "#"}, "minProperties": 1},
     "$.minProperties", "minProperties (1) cannot be met"),
    ({"type": "array", "prefixItems": [{}], "items": False, "minItems": 2}, "$.minItems",
     "'items': false"),
    ({"type": "object", "properties": {"x": {"type": "string", "maxLength": 1,
                                             "minLength": 3}}, "required": ["x"]},
     "$.properties.x.minLength", "minLength (3)"),
]

# Schemas with an instance, but with a part a value can enter and never leave.
NEVER_ENDS: list[tuple[Any, str]] = [
    ({"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "$defs": {"a": NODE}},
     '$["$defs"].a.properties.y'),
    ({"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}], "$defs": {"a": NODE}},
     '$["$defs"].a.properties.y'),
    ({"type": "array", "items": {"$ref": "#/$defs/a"}, "$defs": {"a": NODE}},
     '$["$defs"].a.properties.y'),
]

KEPT: list[Any] = [
    {"type": ["string", "null"], "minLength": 5, "maxLength": 2},  # null is an instance
    {"type": "number", "exclusiveMinimum": 2, "exclusiveMaximum": 3},
    {"type": "object", "properties": {"x": {"type": "array", "minItems": 3, "maxItems": 1}}},
    {"type": "string", "enum": [1, "a"]},
    {"type": "object", "properties": {"x": {"$ref": "#"}}},  # optional self-reference
    {"anyOf": [{"enum": []}, {"type": "null"}]},  # an empty member leaves the others
    {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}},
     "required": ["kids"]},
]


@pytest.mark.parametrize("schema, path, words", NO_INSTANCE)
def test_no_instance_is_refused_naming_path_and_keyword(schema: Any, path: str,
                                                        words: str) -> None:
    with pytest.raises(SchemaValidationError) as e:
        check_finite(prepare_schema(schema))
    assert e.value.path == path
    assert str(e.value).startswith(f"the schema has no instance: at {path}: ")
    assert words in str(e.value)


@pytest.mark.parametrize("schema, path", NEVER_ENDS)
def test_part_that_never_ends_is_refused_naming_the_ref(schema: Any, path: str) -> None:
    with pytest.raises(SchemaValidationError) as e:
        check_finite(prepare_schema(schema))
    assert e.value.path == path
    assert f"has a part with no finite instance: the $ref at {path}" in str(e.value)


@pytest.mark.parametrize("schema", KEPT)
def test_schemas_with_instances_are_kept(schema: Any) -> None:
    check_finite(prepare_schema(schema))


def test_real_world_corpus_is_kept() -> None:
    """No schema of schemas/ or schemas/realworld/ is refused by the analysis."""
    checked = 0
    for path in sorted((REPO / "schemas").glob("**/*.json")):
        doc = json.loads(path.read_text())
        try:
            schema = prepare_schema(doc.get("schema", doc) if isinstance(doc, dict) else doc)
        except GrammarError:  # refused for another reason (covered elsewhere)
            continue
        check_finite(schema)
        checked += 1
    assert checked > 250


# -- grammars --------------------------------------------------------------------------------------
GRAMMARS: list[tuple[str, str, str | None]] = [
    ("ebnf", 'root ::= "a" root', "matches no finite text: rule 'root'"),
    ("lark", 'start: "a" start\n', "matches no finite text: rule 'start'"),
    ("lark", 'start: "a" b\nb: "b" start\n', "matches no finite text: rule 'start'"),
    ("ebnf", 'root ::= "a" | b\nb ::= "b" b', "entered but never completed: rule 'b'"),
    ("lark", 'start: "x" | "a" loop\nloop: "b" loop\n', "never completed: rule 'loop'"),
    ("lark", 'start: item*\nitem: "(" item ")"\n', "never completed: rule 'item'"),
    ("lark", 'start: a\na: "x" a | "y"\n', None),
    ("ebnf", 'root ::= item+\nitem ::= [a-z] | "(" item* ")"', None),
    ("ebnf", 'root ::= ("x" | "y"){2,3} [ \\t]*', None),
    ("ebnf", 'root ::= a (= "b")\na ::= "x"', None),
    ("lark", '%json { "type": "object" }\nstart: "x" %json{}\n', None),  # not xgrammar's
]


@pytest.mark.parametrize("syntax, text, words", GRAMMARS)
def test_grammar_rules_that_never_complete_are_refused(syntax: str, text: str,
                                                       words: str | None) -> None:
    if words is None:
        check_grammar_productive(text, syntax)
        return
    with pytest.raises(GrammarError) as e:
        check_grammar_productive(text, syntax)
    assert e.value.path == "$.grammar" and words in str(e.value)


def test_what_the_parsers_raise_is_a_syntax_error() -> None:
    """Not only their own exception types: a Lark terminal's regex raises the ``regex``
    module's error, a huge repeat Python's OverflowError (both were 500s in the soak)."""
    with pytest.raises(GrammarError, match="unterminated character set") as e:
        check_lark("start: /[/\n")
    assert e.value.path == "$.grammar"
    with pytest.raises(GrammarError, match="repetition number is too large") as e:
        check_regex("a{4294967296}")
    assert e.value.path == "$.regex"


def test_xgrammar_own_json_grammar_shows_the_cycle() -> None:
    """The backstop in the xgrammar backend reads xgrammar's own grammar of a schema."""
    schema = {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}},
              "$defs": {"a": NODE}}
    grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False,
                                           strict_mode=False)
    assert unproductive_rules(str(grammar))
    fine = xgr.Grammar.from_json_schema(json.dumps({"type": "array", "items": {"$ref": "#"}}))
    assert unproductive_rules(str(fine)) == []


# -- nesting ----------------------------------------------------------------------------------------
def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


@pytest.mark.parametrize("depth", [1, 64, 65, 150, 250, 300, 1000, 5000, 100_000])
def test_depth_is_measured_without_recursion(depth: int) -> None:
    value = _nested(depth)
    found, path = value_depth(value, 64)
    assert (path is None) == (depth <= 64) and found == min(depth, 65)
    assert text_depth(json.dumps(value) if depth < 900 else "[" * depth + "]" * depth) == depth
    assert not has_lone_surrogate(value)  # a loop: no RecursionError at any depth


def test_text_depth_ignores_brackets_in_strings() -> None:
    assert text_depth('{"a": "[[[[{{", "b": ["\\"[["]}') == 2
    assert text_depth(b"") == 0


def test_paren_depth_of_regexes_and_grammars() -> None:
    assert paren_depth("(a(b)c)") == 2
    assert paren_depth(r"\(\(\(a\)") == 0
    assert paren_depth("[(((]a") == 0
    assert paren_depth('start: "((((" (a)', quotes='"') == 1
    assert paren_depth("(?:" * 5000 + ")" * 5000) == 5000


def test_schema_depth_names_path_and_limit() -> None:
    deep = {"type": "object", "properties": {"a": _nested(70)}}
    with pytest.raises(SchemaValidationError) as e:
        check_schema_depth(deep, 64)
    assert e.value.path is not None and e.value.path.startswith("$.properties.a")
    assert "more than 64 levels deep" in str(e.value) and "at most 64 levels" in str(e.value)
    with pytest.raises(SchemaValidationError, match="nested 100 levels deep"):
        check_schema_depth("[" * 100 + "]" * 100, 64)
    with pytest.raises(SchemaValidationError) as e:
        check_schema_depth({"pattern": "(" * 70 + ")" * 70}, 64)
    assert e.value.path == "$.pattern"
    check_schema_depth(_nested(64), 64)


def test_bounded_lru_holds_bytes_and_entries() -> None:
    lru: BoundedLRU[int] = BoundedLRU(max_entries=3, max_bytes=100)
    for i in range(5):
        lru.put(f"k{i}", i, cost=10)
    assert len(lru) == 3 and lru.get("k0") is None and lru.get("k4") == 4
    lru.put("big", 0, cost=95)  # evicts until the bytes fit
    assert lru.get("big") == 0 and lru.nbytes <= 100
    lru.put("huge", 1, cost=1000)  # heavier than the bound: not kept
    assert lru.get("huge") is None
