"""Grammar-layer API on the SmolLM2 tokenizer: bad input -> GrammarError with a location,
strict mode, matcher contract (stop tokens, sticky errors, rollback, bitmask misuse), regex,
Lark, EBNF and choice grammars (tool calls: test_fsm_tools.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from grammarserve.errors import (
    GrammarBackendError,
    GrammarError,
    GrammarSyntaxError,
    SchemaValidationError,
    StrictSchemaError,
    UnsupportedSchemaError,
)
from grammarserve.fsm import CompiledGrammar, GrammarCompiler
from grammarserve.fsm.config import BackendName
from grammarserve.fsm.conformance import bit, walk

pytestmark = pytest.mark.model  # every test here uses the embedded model


EOS = 2
WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                           "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}


@pytest.fixture(scope="module")
def compiler(tokenizer: Any) -> GrammarCompiler:
    # A generous compile timeout: beside busy loops a 10 s compile bound expired (issue 18).
    return GrammarCompiler(tokenizer, compile_timeout_s=600)


def accepts(compiler: GrammarCompiler, tokenizer: Any, grammar: CompiledGrammar,
            text: str) -> bool:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return walk(grammar.matcher(), ids, EOS, compiler.allocate_bitmask(1))[0]


# -- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("schema, error, needle, path", [
    ('{"type": "object", ', SchemaValidationError, "line 1 column 20", "$"),
    ("[1, 2]", SchemaValidationError, "must be an object or a boolean", "$"),
    ({"type": "object", "properties": {"a": {"type": "strin"}}}, SchemaValidationError,
     "$.properties.a.type", "$.properties.a.type"),
    ({"properties": {"a": {"minLength": -1}}}, SchemaValidationError, "minLength",
     "$.properties.a.minLength"),
    ({"$ref": "https://example.com/schema.json"}, UnsupportedSchemaError, "remote $ref",
     '$["$ref"]'),
    ({"properties": {"a": {"$ref": "#/$defs/missing"}}}, SchemaValidationError,
     "does not resolve", '$.properties.a["$ref"]'),
    # NOTE: a keyword inside a recursion through 'not' cannot be left to a run-time value
    # check (see checks.py)
    ({"$defs": {"t": {"type": "array", "items": {"not": {"$ref": "#/$defs/t"}},
                      "uniqueItems": True}}, "$ref": "#/$defs/t"}, UnsupportedSchemaError,
     "'not'", '$["$defs"].t.items.not'),
    # a condition inside the recursion it tests: no check holds it at every depth
    ({"$defs": {"t": {"type": "array", "uniqueItems": True, "items": {
        "if": {"$ref": "#/$defs/t"}, "then": {"minItems": 1}}}}, "$ref": "#/$defs/t"},
     UnsupportedSchemaError, "'if'", '$["$defs"].t.items.if'),
    ({"type": "object", "dependentRequired": {f"k{i}": ["d"] for i in range(7)}},
     UnsupportedSchemaError,
     "dependentRequired", "$.dependentRequired"),
    ({"properties": {"a": {"$ref": "https://example.com/a.json"}}}, UnsupportedSchemaError,
     "remote", '$.properties.a["$ref"]'),
    (False, SchemaValidationError, "accepts no instance", "$"),
    ({"properties": {"a": {"pattern": "("}}}, SchemaValidationError, "regex",
     "$.properties.a.pattern"),
])
def test_bad_schema_names_problem_and_path(compiler: GrammarCompiler, schema: Any,
                                           error: type, needle: str, path: str) -> None:
    with pytest.raises(error) as info:
        compiler.compile_json_schema(schema)
    assert isinstance(info.value, GrammarError)
    assert needle in str(info.value)
    assert info.value.path == path


def test_bad_regex_reports_position(compiler: GrammarCompiler) -> None:
    with pytest.raises(GrammarSyntaxError) as info:
        compiler.compile_regex("ab(c")
    assert "position" in str(info.value) and info.value.column is not None


def test_lark_syntax_error_has_line_and_column(compiler: GrammarCompiler) -> None:
    with pytest.raises(GrammarSyntaxError) as info:
        compiler.compile_grammar('start: "a" item\nitem: "b" |\n  ) "c"\n')
    assert info.value.line == 3 and info.value.column is not None
    assert "line 3" in str(info.value)
    with pytest.raises(GrammarSyntaxError, match="undefined|not defined|used but"):
        compiler.compile_grammar('start: "a" missing\n')


def test_ebnf_errors(compiler: GrammarCompiler) -> None:
    with pytest.raises(GrammarSyntaxError, match="root"):
        compiler.compile_grammar('main ::= "a"', syntax="ebnf")
    with pytest.raises(GrammarError):
        compiler.compile_grammar('root ::= "a" (', syntax="ebnf")
    with pytest.raises(GrammarError, match="syntax"):
        compiler.compile_grammar("root ::= x", syntax="yaml")


def test_async_delivers_front_end_errors(compiler: GrammarCompiler) -> None:
    future = compiler.compile_async("json_schema", "{nope")
    with pytest.raises(SchemaValidationError):
        future.result()


def test_a_spec_made_by_one_compiler_compiles_in_another(compiler: GrammarCompiler,
                                                        tokenizer: Any) -> None:
    import pickle

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    spec = compiler.spec("json_schema", schema)
    assert compiler.compile_spec_async(spec).result() is compiler.compile_json_schema(schema)
    other = GrammarCompiler(tokenizer)  # e.g. the engine process's, same options
    other.front.spec = None  # type: ignore[assignment, method-assign]  # no front end there
    grammar = other.compile_spec_async(pickle.loads(pickle.dumps(spec))).result()
    ids = tokenizer.encode('{"n":7}', add_special_tokens=False)
    assert walk(grammar.matcher(), ids, EOS, other.allocate_bitmask(1))[0]
    with pytest.raises(SchemaValidationError):
        compiler.spec("json_schema", "{nope")


# -- strict mode -------------------------------------------------------------------------------
@pytest.mark.parametrize("schema, needle", [
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
     "'additionalProperties' is required to be supplied and to be false"),
    ({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
      "required": ["a"], "additionalProperties": False}, "Missing 'b'"),
    ({"anyOf": [{"type": "object"}]}, "must not be 'anyOf'"),
    ({"type": "object", "properties": {"a": {"allOf": [{"type": "string"}]}}, "required": ["a"],
      "additionalProperties": False}, "'allOf' is not permitted"),
    ({"type": "object", "properties": {"a": {"type": "string", "format": "iri"}},
      "required": ["a"], "additionalProperties": False}, "'format'"),
])
def test_strict_mode_openai_messages(compiler: GrammarCompiler, schema: Any,
                                     needle: str) -> None:
    with pytest.raises(StrictSchemaError) as info:
        compiler.compile_json_schema(schema, strict=True)
    assert str(info.value).startswith("Invalid schema: In context=(")
    assert needle in str(info.value)


def test_strict_accepts_openai_sdk_style_schema(compiler: GrammarCompiler,
                                                tokenizer: Any) -> None:
    schema = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
              "properties": {"name": {"type": "string"},
                             "age": {"anyOf": [{"type": "integer"}, {"type": "null"}]}},
              "$defs": {}}
    grammar = compiler.compile_json_schema(schema, strict=True)
    assert accepts(compiler, tokenizer, grammar, '{"name": "Ann", "age": null}')
    assert not accepts(compiler, tokenizer, grammar, '{"name": "Ann"}')


# -- matcher contract --------------------------------------------------------------------------
def test_stop_token_only_where_grammar_may_end(compiler: GrammarCompiler,
                                               tokenizer: Any) -> None:
    matcher = compiler.compile_json_schema(WEATHER).matcher()
    bitmask = compiler.allocate_bitmask(2)
    ids = tokenizer.encode('{"city": "Rome", "unit": "c"}', add_special_tokens=False)
    for t in ids:
        matcher.fill_bitmask(bitmask, 1)
        assert not bit(bitmask, 1, EOS) and bit(bitmask, 1, t)
        assert matcher.accept_token(t)
    matcher.fill_bitmask(bitmask, 1)
    assert bit(bitmask, 1, EOS)
    for special in (0, 1):  # <|endoftext|>, <|im_start|> are never allowed
        assert not bit(bitmask, 1, special)
    assert bitmask[0].eq(-1).all()  # other rows untouched
    assert matcher.accept_token(EOS) and matcher.is_terminated() and not matcher.is_error()
    assert matcher.forced_tokens() == []


def test_errors_are_sticky_and_never_raise(compiler: GrammarCompiler, tokenizer: Any) -> None:
    matcher = compiler.compile_json_schema(WEATHER).matcher()
    assert not matcher.accept_token(tokenizer.encode("hello", add_special_tokens=False)[0])
    assert matcher.is_error() and matcher.error()
    assert not matcher.accept_token(tokenizer.encode("{", add_special_tokens=False)[0])
    matcher.rollback(1)
    assert matcher.is_error()
    bitmask = compiler.allocate_bitmask(1)
    matcher.fill_bitmask(bitmask, 0)  # only stop tokens, so the request can end
    assert bit(bitmask, 0, EOS) and int(bitmask[0].ne(0).sum()) == 1
    assert matcher.forced_tokens() == []
    assert not matcher.accept_token(10**9)  # out-of-vocabulary id: error, not exception


def test_token_after_termination_is_an_error(compiler: GrammarCompiler,
                                             tokenizer: Any) -> None:
    matcher = compiler.compile_regex("a").matcher()
    a = tokenizer.encode("a", add_special_tokens=False)[0]
    assert matcher.accept_token(a) and matcher.accept_token(EOS) and matcher.is_terminated()
    assert not matcher.accept_token(a)
    assert matcher.is_error() and "terminated" in (matcher.error() or "")


def test_rollback_restores_state(compiler: GrammarCompiler, tokenizer: Any) -> None:
    backends: tuple[BackendName, ...] = ("llguidance", "xgrammar")
    for backend in backends:
        grammar = compiler.with_backend(backend).compile_json_schema(WEATHER)
        matcher = grammar.matcher()
        bitmask = compiler.allocate_bitmask(2)
        ids = tokenizer.encode('{"city": "Rome", "unit": "c"}', add_special_tokens=False)
        for t in ids[:4]:
            assert matcher.accept_token(t)
        matcher.fill_bitmask(bitmask, 0)
        for t in ids[4:]:
            assert matcher.accept_token(t)
        assert matcher.accept_token(EOS) and matcher.is_terminated()
        matcher.rollback(len(ids) - 4 + 1)
        assert not matcher.is_terminated()
        matcher.fill_bitmask(bitmask, 1)
        assert torch.equal(bitmask[0], bitmask[1]), backend
        with pytest.raises(ValueError, match="n >= 0"):
            matcher.rollback(-1)


def test_bitmask_misuse_raises_with_fix(compiler: GrammarCompiler) -> None:
    matcher = compiler.compile_regex("[0-9]+").matcher()
    with pytest.raises(ValueError, match="allocate_bitmask"):
        matcher.fill_bitmask(torch.zeros((1, 1536), dtype=torch.int64), 0)
    with pytest.raises(ValueError, match="width 1536"):
        matcher.fill_bitmask(torch.zeros((1, 100), dtype=torch.int32), 0)
    with pytest.raises(ValueError, match="out of range"):
        matcher.fill_bitmask(compiler.allocate_bitmask(2), 2)
    assert compiler.vocab_size == 49152 and compiler.stop_token_ids == (EOS,)


# -- other grammar kinds -----------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["auto", "llguidance", "xgrammar"])
def test_regex_lark_ebnf_choice(compiler: GrammarCompiler, tokenizer: Any,
                                backend: BackendName) -> None:
    c = compiler if backend == "auto" else compiler.with_backend(backend)
    regex = c.compile_regex(r"[0-9]{3}-[a-z]+")
    assert accepts(c, tokenizer, regex, "123-abc")
    assert not accepts(c, tokenizer, regex, "12-abc")
    lark = c.compile_grammar('start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]+/\n')
    assert accepts(c, tokenizer, lark, "(1,22,333)")
    assert not accepts(c, tokenizer, lark, "(1,)")
    ebnf = c.compile_grammar('root ::= "x" [0-9]+', syntax="ebnf")
    assert accepts(c, tokenizer, ebnf, "x42") and not accepts(c, tokenizer, ebnf, "x")
    choice = c.compile_choice(["yes", "no", 'say "hi"'])
    for option in ("yes", "no", 'say "hi"'):
        assert accepts(c, tokenizer, choice, option)
    assert not accepts(c, tokenizer, choice, "maybe")


def test_choice_validation(compiler: GrammarCompiler) -> None:
    for bad in ([], ["a", "a"], ["a", 3], "ab"):
        with pytest.raises(GrammarError):
            compiler.compile_choice(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_whitespace_is_bounded(tokenizer: Any, backend: BackendName) -> None:
    tight = GrammarCompiler(tokenizer, max_whitespace=2, json_style="flexible", backend=backend,
                            compile_timeout_s=600)
    grammar = tight.compile_json_schema(WEATHER)
    assert grammar.backend == backend
    assert accepts(tight, tokenizer, grammar, '{"city":  "Rome", "unit": "c"}')
    assert accepts(tight, tokenizer, grammar, '{ "city" : "Ro' + " " * 30 + 'me" , "unit":"c"}')
    assert not accepts(tight, tokenizer, grammar, '{"city":' + " " * 8 + '"Rome","unit":"c"}')
    assert not accepts(tight, tokenizer, grammar, '{"city": "Rome",\n\n\n"unit":"c"}')
    assert not accepts(tight, tokenizer, grammar, '{"city": "Rome", "unit": "c"}\n\n\n')
    # Many separate whitespace tokens cannot add up past the bound either.
    matcher = grammar.matcher()
    bitmask = tight.allocate_bitmask(1)
    space = tokenizer.encode(" ", add_special_tokens=False)[0]
    for t in tokenizer.encode('{"city":', add_special_tokens=False) + [space, space]:
        assert matcher.accept_token(t)
    matcher.fill_bitmask(bitmask, 0)
    assert not bit(bitmask, 0, space)
    matcher.rollback(1)
    matcher.fill_bitmask(bitmask, 0)
    assert bit(bitmask, 0, space)


def test_llguidance_refusal_is_reported(compiler: GrammarCompiler) -> None:
    # a multipleOf with more digits than llguidance takes; xgrammar would ignore it
    with pytest.raises(GrammarError) as info:
        compiler.compile_json_schema({"type": "integer", "multipleOf": 12345678899999998})
    assert "multipleOf" in str(info.value)
    assert isinstance(info.value, (UnsupportedSchemaError, GrammarBackendError))
