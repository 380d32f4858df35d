"""Strings xgrammar does not compile exactly stay with llguidance, so a schema means the same
for its first requests and once reused: xgrammar's length-bounded strings take raw control
characters (invalid JSON) and no escapes, and its pattern strings no escapes
(mlc-ai/xgrammar#800). On the embedded model's tokenizer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from grammarserve.errors import UnsupportedSchemaError
from grammarserve.fsm import CompiledGrammar, GrammarCompiler
from grammarserve.fsm.backends.xgrammar_subset import may_need_escape, optional_groups, xgrammar_schema
from grammarserve.fsm.conformance import walk

pytestmark = pytest.mark.model  # the embedded model's tokenizer

EOS = 2
NOTE = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 40},
                                         "code": {"type": "string", "pattern": "^[A-Z]{2}$"}},
        "required": ["title", "code"], "additionalProperties": False}
#: Values JSON writes with escapes, and raw control characters JSON forbids in a string.
ESCAPED = ['{"title": "say \\"hi\\"", "code": "AB"}', '{"title": "a\\nb\\\\c", "code": "AB"}',
           '{"title": "tab\\there", "code": "AB"}']
RAW = ['{"title": "tab\there", "code": "AB"}', '{"title": "a\x01b", "code": "AB"}']


@pytest.mark.parametrize("pattern,needs", [
    ("^[a-z0-9_]{3,20}$", False), (r"^\d+\.\d+$", False), (r"^[A-Za-z0-9.-]+$", False),
    (r"^\w+$", False), ("^a.*$", True), ("^[^x]*$", True), (r"^\s*$", True),
    ('^[a-z"]$', True), (r"^a\\b$", True), (r"^\u0041$", True), (r"^\x41$", True)])
def test_may_need_escape(pattern: str, needs: bool) -> None:
    assert may_need_escape(pattern) is needs


@pytest.mark.parametrize("schema,keyword", [
    ({"type": "string", "maxLength": 5}, "maxLength"),
    ({"type": "string", "minLength": 1}, "minLength"),
    ({"type": "string", "pattern": "^a.*$"}, "pattern"),
])
def test_the_subset_refuses_strings_xgrammar_would_change(schema: dict[str, Any],
                                                           keyword: str) -> None:
    with pytest.raises(UnsupportedSchemaError) as e:
        xgrammar_schema(schema)
    assert e.value.keyword == keyword


def test_a_one_class_pattern_still_absorbs_the_bounds() -> None:
    out = xgrammar_schema({"type": "string", "pattern": "^[a-z]+$", "maxLength": 4})
    assert out == {"type": "string", "pattern": "^[a-z]{1,4}$"}


def _accepts(compiler: GrammarCompiler, grammar: CompiledGrammar, tokenizer: Any,
             text: str) -> bool:
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    return walk(grammar.matcher(), ids, EOS, compiler.allocate_bitmask(1))[0]


def test_first_and_reused_grammars_take_the_same_strings(tokenizer: Any) -> None:
    compiler = GrammarCompiler(tokenizer, upgrade_niceness=0)
    first = compiler.compile_json_schema(NOTE)
    firsts = [_accepts(compiler, first, tokenizer, t) for t in ESCAPED + RAW]
    upgrade = first.request_upgrade()
    if upgrade is not None:
        upgrade.result()
    reused = compiler.compile_json_schema(NOTE)
    assert firsts == [True] * len(ESCAPED) + [False] * len(RAW)
    assert [_accepts(compiler, reused, tokenizer, t) for t in ESCAPED + RAW] == firsts
    for text in ESCAPED:
        json.loads(text)  # the escaped forms are JSON; the raw ones are not
    for text in RAW:
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)


#: Valid values, then values a backend's own format took although they are not valid (02-29 in
#: a year that is not a leap year: both backends; 02-30, 04-31: xgrammar; leading zeros).
FORMATS = {"date": (["2024-02-29", "2000-02-29", "2023-04-30"],
                    ["2023-02-29", "1900-02-29", "2025-02-30", "2023-04-31"]),
           "date-time": (["2024-02-29T10:00:00Z", "2023-04-30t10:00:00.5z"],
                         ["2023-02-29T10:00:00Z", "2023-04-31T10:00:00+01:00"]),
           "ipv4": (["1.2.3.4"], ["01.2.3.4"])}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_formats_mean_the_same_first_and_reused(tokenizer: Any, fmt: str) -> None:
    compiler = GrammarCompiler(tokenizer, upgrade_niceness=0)
    schema = {"type": "object", "properties": {"v": {"type": "string", "format": fmt}},
              "required": ["v"], "additionalProperties": False}
    good, bad = FORMATS[fmt]
    texts = [json.dumps({"v": v}) for v in good + bad]
    first = compiler.compile_json_schema(schema)
    firsts = [_accepts(compiler, first, tokenizer, t) for t in texts]
    upgrade = first.request_upgrade()
    if upgrade is not None:
        upgrade.result()
    reused = compiler.compile_json_schema(schema)
    assert firsts == [True] * len(good) + [False] * len(bad)
    assert [_accepts(compiler, reused, tokenizer, t) for t in texts] == firsts
    # the calendar is a pattern xgrammar takes exactly: such schemas still go to it
    assert reused.backend == ("llguidance" if fmt == "ipv4" else "xgrammar")


def test_an_unknown_schema_uri_is_read_as_2020_12(tokenizer: Any) -> None:
    compiler = GrammarCompiler(tokenizer, background_upgrade=False)
    schema = {"$schema": "http://json-schema.org/schema", "type": "object",
              "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    grammar = compiler.compile_json_schema(schema)
    assert _accepts(compiler, grammar, tokenizer, '{"a": 1}')
    assert "$schema" in schema  # the caller's schema is left as it was


def test_optional_groups_written_as_zero_or_one() -> None:
    """Only a group's own ``?`` changes: escaped parentheses, classes and ``(?:`` stay."""
    assert optional_groups(r"^a(\.\d+)?b$") == r"^a(\.\d+){0,1}b$"
    assert optional_groups(r"^a(?:x)??b$") == r"^a(?:x){0,1}?b$"
    assert optional_groups(r"[)?](a)?\)?$") == r"[)?](a){0,1}\)?$"
    assert optional_groups(r"^((a)?b)?$") == r"^((a){0,1}b){0,1}$"
