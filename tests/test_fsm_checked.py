"""Value checks at run time on the SmolLM2 tokenizer (``fsm/checked_matcher.py``): a value that fails
its check when it closes is rolled back to where the failed attempt began, the token that began
it is banned there, and after the retries the matcher fails with a message."""

from __future__ import annotations

import json
from typing import Any

import pytest

from grammarserve.errors import UnsupportedSchemaError
from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.checked_matcher import CheckedMatcher
from grammarserve.fsm.conformance import bit, walk

pytestmark = pytest.mark.model  # the embedded model's tokenizer

UNIQUE = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
NOT = {"type": "object", "properties": {"name": {"type": "string",
                                                 "not": {"pattern": "^a.*b$"}}},
       "required": ["name"], "additionalProperties": False}
CONTAINS = {"type": "array", "items": {"type": "integer"}, "contains": {"const": 3},
            "maxContains": 1}


@pytest.fixture(scope="module")
def compiler(tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, compile_timeout_s=600, background_upgrade=False)


def _walk(compiler: GrammarCompiler, tokenizer: Any, schema: Any, doc: Any) -> bool:
    grammar = compiler.compile_json_schema(schema)
    ids = tokenizer.encode(json.dumps(doc), add_special_tokens=False)
    return walk(grammar.matcher(), ids, compiler.stop_token_ids[0],
                compiler.allocate_bitmask(1))[0]


@pytest.mark.parametrize("schema, valid, invalid", [
    (UNIQUE, [[], ["a"], ["a", "b"], ["a", "A", "a "]], [["a", "a"], ["x", "y", "x"]]),
    (NOT, [{"name": "abc"}, {"name": ""}, {"name": "a"}], [{"name": "ab"}, {"name": "axb"}]),
    (CONTAINS, [[3], [1, 3, 2]], [[], [1, 2], [3, 3], [3, 1, 3]]),
    ({"type": "object", "properties": {"t": {"anyOf": [UNIQUE, {"type": "null"}]}}},
     [{"t": None}, {"t": ["a"]}], [{"t": ["b", "b"]}]),
])
def test_valid_walks_pass_and_invalid_ones_fail_their_checks(
        compiler: GrammarCompiler, tokenizer: Any, schema: Any, valid: list[Any],
        invalid: list[Any]) -> None:
    grammar = compiler.compile_json_schema(schema)
    assert grammar.value_checks and isinstance(grammar.matcher(), CheckedMatcher)
    for doc in valid:
        assert _walk(compiler, tokenizer, schema, doc), doc
    for doc in invalid:
        assert not _walk(compiler, tokenizer, schema, doc), doc


def test_without_value_checks_the_keyword_is_refused(tokenizer: Any) -> None:
    plain = GrammarCompiler(tokenizer, value_checks=False, compile_timeout_s=600)
    with pytest.raises(UnsupportedSchemaError, match="uniqueItems"):
        plain.compile_json_schema(UNIQUE)
    assert plain.compile_json_schema({"type": "string"}).value_checks == ()


def test_checks_are_part_of_the_cache_key(compiler: GrammarCompiler) -> None:
    with_check = compiler.compile_json_schema(UNIQUE)
    without = compiler.compile_json_schema({"type": "array", "items": {"type": "string"}})
    assert with_check is not without and without.value_checks == ()


def _feed_until_retraction(m: Any, ids: list[int]) -> tuple[int, int]:
    """Accept ``ids`` until one is rolled back; (its index, tokens taken back)."""
    for i, t in enumerate(ids):
        assert m.accept_token(t), m.error()
        n = m.take_retraction()
        if n:
            return i, n
    raise AssertionError("no check failed")


def test_a_repeated_item_is_rolled_back_and_its_first_token_banned(
        compiler: GrammarCompiler, tokenizer: Any) -> None:
    grammar = compiler.compile_json_schema(UNIQUE)
    m = grammar.matcher()
    text = '["a", "b", "a"]'
    ids = tokenizer.encode(text, add_special_tokens=False)
    i, n = _feed_until_retraction(m, ids)
    kept = ids[:i + 1 - n]
    assert m.take_retraction() == 0  # counted once
    prefix = tokenizer.decode(kept)
    assert prefix.startswith('["a", "b",') and len(prefix) < len('["a", "b", "a"')
    banned = ids[len(kept)]
    assert 'a' in tokenizer.decode([banned])  # the content token, not the separator
    bitmask = compiler.allocate_bitmask(1)
    m.fill_bitmask(bitmask, 0)
    assert not bit(bitmask, 0, banned)
    rest = tokenizer.encode(text.replace('"a"]', '"c"]')[len(prefix):], add_special_tokens=False)
    for t in rest + [compiler.stop_token_ids[0]]:
        m.fill_bitmask(bitmask, 0)
        assert bit(bitmask, 0, t) and m.accept_token(t) and not m.take_retraction()
    assert m.is_terminated() and m.retries == 1


def test_held_from_covers_the_open_item(compiler: GrammarCompiler, tokenizer: Any) -> None:
    m = compiler.compile_json_schema(UNIQUE).matcher()
    assert m.held_from() is None
    ids = tokenizer.encode('["a", "bc', add_special_tokens=False)
    for t in ids:
        assert m.accept_token(t)
    first = m.held_from()
    assert first is not None and 'b' in tokenizer.decode(ids[first:])
    assert m.accept_token(tokenizer.encode('"', add_special_tokens=False)[0])
    # NOTE: between items a retry of the next item may still back off to the free tokens
    # before it (the whitespace before an item, in the flexible style): they stay held
    between = m.held_from()
    assert between is not None and between <= first
    assert m.accept_token(tokenizer.encode(']', add_special_tokens=False)[0])
    assert m.held_from() is None  # the array closed: nothing can be taken back


def test_retries_run_out_with_a_message(tokenizer: Any) -> None:
    one = GrammarCompiler(tokenizer, check_retries=1, compile_timeout_s=600)
    m = one.compile_json_schema(UNIQUE).matcher()
    ids = tokenizer.encode('["a", "a"', add_special_tokens=False)
    i, n = _feed_until_retraction(m, ids)
    again = ids[i + 1 - n:i + 1]
    for t in again[:-1]:
        assert m.accept_token(t)
    assert not m.accept_token(again[-1])
    assert m.is_error() and "after 1 retries" in (m.error() or "")
    assert isinstance(m, CheckedMatcher) and m.exhausted


def test_forced_tokens_are_not_banned(tokenizer: Any) -> None:
    """The item's opening quote and ``hello world`` are forced: the retry bans the first free
    token after them."""
    schema = {"type": "array", "minItems": 1, "items": {"type": "string", "pattern": "^hello world [ab]+$",
                                         "not": {"pattern": "^hello world a+b$"}}}
    compact = GrammarCompiler(tokenizer, json_style="compact", compile_timeout_s=600)
    m = compact.compile_json_schema(schema).matcher()
    forced = tokenizer.encode("[", add_special_tokens=False)
    assert m.accept_token(forced[0])
    while span := m.forced_tokens():
        for t in span:
            assert m.accept_token(t)
        forced += span
    done = tokenizer.decode(forced)
    assert done.startswith('["hello world')
    rest = tokenizer.encode('["hello world aab"]'[len(done):], add_special_tokens=False)
    i, n = _feed_until_retraction(m, rest)
    assert n == i + 1  # back to the first free token of the value, the forced ones stay
    bitmask = compact.allocate_bitmask(1)
    m.fill_bitmask(bitmask, 0)
    assert not bit(bitmask, 0, rest[0])
    assert m.forced_tokens()[:1] != rest[:1]


def test_contains_too_few_retries_at_the_close(compiler: GrammarCompiler,
                                               tokenizer: Any) -> None:
    m = compiler.compile_json_schema(CONTAINS).matcher()
    ids = tokenizer.encode("[1, 2]", add_special_tokens=False)
    i, n = _feed_until_retraction(m, ids)
    assert i == len(ids) - 1 and n == 1  # only the token with the closing bracket
    prefix = tokenizer.decode(ids[:-1])
    rest = tokenizer.encode("[1, 2, 3]"[len(prefix):], add_special_tokens=False)
    for t in rest + [compiler.stop_token_ids[0]]:
        assert m.accept_token(t) and not m.take_retraction()
    assert m.is_terminated()
