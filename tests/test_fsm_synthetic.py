"""Model-free grammar-layer tests on a synthetic 257-token byte-level vocabulary (one token
per byte plus EOS), so they run anywhere."""

from __future__ import annotations

from typing import Any

import pytest

from grammarserve.errors import GrammarError
from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.config import BackendName
from grammarserve.fsm.conformance import bit, walk

BACKENDS: list[BackendName] = ["auto", "llguidance", "xgrammar"]
# NOTE: a length bound as a one-class pattern: xgrammar refuses a bare maxLength (its bounded
# strings take raw control characters and no escapes), a pattern it compiles exactly.
SCHEMA = {"type": "object", "properties": {"name": {"type": "string",
                                                    "pattern": "^[a-z]{0,5}$"},
                                           "n": {"type": "integer", "minimum": 0}},
          "required": ["name", "n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def byte_tokenizer() -> Any:
    from tiny_models import eos_byte_tokenizer

    return eos_byte_tokenizer()


@pytest.fixture(scope="module")
def compilers(byte_tokenizer: Any) -> dict[str, GrammarCompiler]:
    auto = GrammarCompiler(byte_tokenizer, max_whitespace=3, json_style="flexible")
    return {"auto": auto, "llguidance": auto.with_backend("llguidance"),
            "xgrammar": auto.with_backend("xgrammar")}


def check(compiler: GrammarCompiler, tok: Any, grammar: Any, text: str) -> bool:
    ids = tok.encode(text)
    return walk(grammar.matcher(), ids, 0, compiler.allocate_bitmask(1))[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_json_schema_on_byte_vocab(compilers: dict[str, GrammarCompiler], byte_tokenizer: Any,
                                   backend: str) -> None:
    c = compilers[backend]
    assert c.vocab_size == 257 and c.stop_token_ids == (0,)
    g = c.compile_json_schema(SCHEMA)
    for text in ('{"name":"ab","n":3}', '{ "name" : "abcde" ,\n "n": 0 }'):
        assert check(c, byte_tokenizer, g, text), text
    for text in ('{"name":"abcdef","n":3}', '{"name":"ab","n":-1}', '{"n":3,"name":"ab"}',
                 '{"name":"ab","n":3,"x":1}', '{"name":"ab"}', '{"name":    "ab","n":3}'):
        assert not check(c, byte_tokenizer, g, text), text


@pytest.mark.parametrize("backend", BACKENDS)
def test_forced_tokens_and_rollback(compilers: dict[str, GrammarCompiler],
                                    byte_tokenizer: Any, backend: str) -> None:
    c = compilers[backend]
    m = c.compile_json_schema(SCHEMA).matcher()
    bitmask = c.allocate_bitmask(1)
    assert m.accept_token(byte_tokenizer.encode("{")[0])
    forced = m.forced_tokens()
    # With one token per byte, jump-forward holds back nothing but the last byte at most.
    assert byte_tokenizer.decode(forced) in ('"name"', '"name', "")
    for t in forced:
        m.fill_bitmask(bitmask, 0)
        assert bit(bitmask, 0, t) and m.accept_token(t)
    m.rollback(len(forced))
    assert byte_tokenizer.decode(m.forced_tokens()) == byte_tokenizer.decode(forced)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sticky_error_and_stop(compilers: dict[str, GrammarCompiler], byte_tokenizer: Any,
                               backend: str) -> None:
    c = compilers[backend]
    m = c.compile_regex("ab|cd").matcher()
    bitmask = c.allocate_bitmask(1)
    m.fill_bitmask(bitmask, 0)
    assert not bit(bitmask, 0, 0)
    assert not m.accept_token(byte_tokenizer.encode("x")[0])
    assert m.is_error() and not m.accept_token(byte_tokenizer.encode("a")[0])
    m.fill_bitmask(bitmask, 0)
    assert bit(bitmask, 0, 0) and int(bitmask[0].ne(0).sum()) == 1
    choice = c.compile_choice(["yes", "no"])
    assert check(c, byte_tokenizer, choice, "no") and not check(c, byte_tokenizer, choice, "n")


def test_bad_input_without_model(compilers: dict[str, GrammarCompiler]) -> None:
    c = compilers["auto"]
    bad_schemas: list[Any] = ["{", {"type": "nope"}, {"$ref": "other.json"}, {"not": {}}]
    for bad in bad_schemas:
        with pytest.raises(GrammarError):
            c.compile_json_schema(bad)
    with pytest.raises(GrammarError):
        c.compile_regex("(")
    with pytest.raises(GrammarError):
        c.compile_grammar("start: (")


@pytest.mark.parametrize("backend", BACKENDS)
def test_pattern_with_length_bounds(compilers: dict[str, GrammarCompiler], byte_tokenizer: Any,
                                    backend: str) -> None:
    # xgrammar ignores lengths next to a pattern; a one-class pattern absorbs them instead.
    c = compilers[backend]
    schema = {"type": "object", "properties": {"u": {
        "type": "string", "pattern": "^[a-z_]+$", "minLength": 2, "maxLength": 4}},
        "required": ["u"], "additionalProperties": False}
    g = c.compile_json_schema(schema)
    for text in ('{"u":"ab"}', '{"u":"a_cd"}'):
        assert check(c, byte_tokenizer, g, text), text
    for text in ('{"u":"a"}', '{"u":"abcde"}', '{"u":"aB"}', '{"u":""}'):
        assert not check(c, byte_tokenizer, g, text), text


@pytest.mark.parametrize("backend", BACKENDS)
def test_start_mask_is_shared(compilers: dict[str, GrammarCompiler], byte_tokenizer: Any,
                              backend: str) -> None:
    c = compilers[backend]
    g = c.compile_json_schema(SCHEMA)
    first, other = c.allocate_bitmask(2), c.allocate_bitmask(1)
    a = g.matcher()
    a.fill_bitmask(first, 1)  # computed, then shared
    b = g.matcher()
    b.fill_bitmask(other, 0)  # copied: another bitmask, another row
    assert other[0].equal(first[1])
    for t in byte_tokenizer.encode('{"name":'):
        assert b.accept_token(t)
    b.fill_bitmask(other, 0)
    assert not other[0].equal(first[1])
    b.rollback(len('{"name":'))
    b.fill_bitmask(other, 0)
    assert other[0].equal(first[1])
    assert not b.accept_token(byte_tokenizer.encode("x")[0])
    b.fill_bitmask(other, 0)  # error state: only the stop token, even at the start
    assert other[0, 0].item() == 1 and int(other[0, 1:].abs().sum()) == 0


UNTYPED = {"properties": {"a": {"type": "integer"}}, "required": ["a"], "pattern": "^[a-z]{0,2}$"}
RECURSIVE = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}},
             "required": ["kids"], "additionalProperties": False}
UNION = {"$defs": {
    "Cat": {"type": "object", "properties": {"t": {"const": "cat"}, "m": {"type": "integer"}},
            "required": ["t", "m"], "additionalProperties": False},
    "Dog": {"type": "object", "properties": {"t": {"const": "dog"}, "b": {"type": "boolean"}},
            "required": ["t", "b"], "additionalProperties": False}},
    "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}]}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("schema, good, bad", [
    # untyped keywords constrain only their type: xgrammar gets an anyOf of typed branches
    (UNTYPED, ['{"a":1}', '"ab"', "3", "[1]", "null"], ['{"a":"x"}', "{}", '"abc"']),
    # recursion through the root: xgrammar gets it through $defs
    (RECURSIVE, ['{"kids":[]}', '{"kids":[{"kids":[]}]}'], ['{"kids":[{}]}', '{"kids":[1]}']),
    # a discriminated union of $ref branches is disjoint: oneOf == anyOf
    (UNION, ['{"t":"cat","m":1}', '{"t":"dog","b":true}'], ['{"t":"cat","b":true}']),
])
def test_rewrites_for_xgrammar(compilers: dict[str, GrammarCompiler], byte_tokenizer: Any,
                               backend: str, schema: Any, good: list[str], bad: list[str]
                               ) -> None:
    c = compilers[backend]
    g = c.compile_json_schema(schema)
    assert backend != "xgrammar" or g.backend == "xgrammar"
    for text in good:
        assert check(c, byte_tokenizer, g, text), text
    for text in bad:
        assert not check(c, byte_tokenizer, g, text), text


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])  # auto may switch mid-test
def test_prefix_masks_equal_computed_masks(compilers: dict[str, GrammarCompiler],
                                           byte_tokenizer: Any, backend: str) -> None:
    # Masks copied from the grammar's prefix cache equal the masks a fresh grammar computes.
    c = compilers[backend]
    c.cache.clear()
    warm = c.compile_json_schema(SCHEMA)
    for text in ('{"name":"ab","n":3}', '{ "name":"x","n":1}', '{"n":1}'):
        check(c, byte_tokenizer, warm, text)  # fills the prefix cache, also on dead ends
    c.cache.clear()
    fresh = c.compile_json_schema(SCHEMA)
    assert fresh is not warm
    for text in ('{"name":"xyz","n":42}', '{ "name" : "q", "n": 7 }'):
        a, b = warm.matcher(), fresh.matcher()
        ma, mb = c.allocate_bitmask(1), c.allocate_bitmask(1)
        ids = byte_tokenizer.encode(text) + [0]
        for t in ids:
            a.fill_bitmask(ma, 0)
            b.fill_bitmask(mb, 0)
            assert ma.equal(mb)
            assert a.accept_token(t) and b.accept_token(t)
        a.rollback(len(ids) - 2)  # back into the cached depth
        b.rollback(len(ids) - 2)
        a.fill_bitmask(ma, 0)
        b.fill_bitmask(mb, 0)
        assert ma.equal(mb)
