"""Structural tags (vLLM's and SGLang's ``response_format`` of type ``structural_tag``) compiled
to one llguidance grammar: texts walked token by token on SmolLM2's own tokenizations (accepted,
or stopped by the mask), for the legacy ``structures``/``triggers`` shape and the ``format``
tree; and the front end's refusals, each naming the format type or keyword and its path."""

from __future__ import annotations

import json
from typing import Any

import pytest

from grammarserve.errors import GrammarError, SchemaValidationError, UnsupportedSchemaError
from grammarserve.fsm import CompiledGrammar, GrammarCompiler
from grammarserve.fsm.config import GrammarConfig
from grammarserve.fsm.conformance import walk
from grammarserve.fsm.frontend import SpecBuilder

EOS = 2
WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                           "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}},
        "required": ["zone"]}
LEGACY: dict[str, Any] = {"type": "structural_tag", "triggers": ["<function="], "structures": [
    {"begin": "<function=get_weather>", "schema": WEATHER, "end": "</function>"},
    {"begin": "<function=get_time>", "schema": TIME, "end": "</function>"}]}
CALL_W = '<function=get_weather>{"city": "Rome", "unit": "c"}</function>'
CALL_T = '<function=get_time>{"zone": "UTC"}</function>'


def _tag(begin: str, schema: dict[str, Any], end: str = "</function>") -> dict[str, Any]:
    return {"type": "tag", "begin": begin, "content": {"type": "json_schema",
                                                        "json_schema": schema}, "end": end}


def _triggered(**flags: Any) -> dict[str, Any]:
    return {"format": {"type": "triggered_tags", "triggers": ["<function="], "tags": [
        _tag("<function=get_weather>", WEATHER), _tag("<function=get_time>", TIME)], **flags}}


@pytest.fixture(scope="module")
def compiler(tokenizer: Any) -> GrammarCompiler:
    # NOTE: flexible JSON (the engine's default style): any whitespace inside the calls
    return GrammarCompiler(tokenizer, json_style="flexible", background_upgrade=False)


def _accepts(compiler: GrammarCompiler, tokenizer: Any, grammar: CompiledGrammar,
             text: str) -> bool:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return walk(grammar.matcher(), ids, EOS, compiler.allocate_bitmask(1))[0]


def _check(compiler: GrammarCompiler, tokenizer: Any, tag: dict[str, Any] | str,
           good: list[str], bad: list[str]) -> None:
    grammar = compiler.compile_structural_tag(tag)
    assert grammar.backend == "llguidance"
    for text in good:
        assert _accepts(compiler, tokenizer, grammar, text), text
    for text in bad:
        assert not _accepts(compiler, tokenizer, grammar, text), text


@pytest.mark.model
def test_legacy_free_text_then_calls_wherever_the_trigger_is_written(
        compiler: GrammarCompiler, tokenizer: Any) -> None:
    _check(compiler, tokenizer, LEGACY, good=[
        "", "No call needed.", "Let me check." + CALL_W, CALL_W + CALL_T,
        f"First {CALL_T} then.{CALL_W} done <func", "a < b and <function is not a trigger",
        '<function=get_weather>{"city":"Oslo",\n "unit":"f"}</function>\n\nok',
    ], bad=[
        "<function=get_date>{}</function>",  # no structure begins so
        '<function=get_weather>{"city": "Rome"}</function>',  # 'unit' required
        '<function=get_time>{"zone": "utc"}</function>',  # the pattern
        '<function=get_weather>{"city": "Rome", "unit": "c"} done',  # no end
        '<function=get_weather>{"city": "Rome", "unit": "c"}</function',  # cut in the end
        'text <function= get_weather>{"city": "Rome", "unit": "c"}</function>',
    ])
    # the JSON text of the same object compiles to the same grammar (one cache entry)
    before = compiler.cache_stats().hits
    compiler.compile_structural_tag(json.dumps(LEGACY))
    compiler.compile_structural_tag(LEGACY)
    assert compiler.cache_stats().hits >= before + 1


@pytest.mark.model
def test_triggered_tags_flags(compiler: GrammarCompiler, tokenizer: Any) -> None:
    _check(compiler, tokenizer, _triggered(), good=["hi", "hi " + CALL_W + " bye"], bad=[])
    # at least one: a tag first (no leading text, as xgrammar), then text and tags again
    _check(compiler, tokenizer, _triggered(at_least_one=True),
           good=[CALL_W, CALL_W + " and " + CALL_T + " ok"], bad=["", "hi", "hi " + CALL_W])
    # stop after the first: text, at most one tag, then the output ends
    _check(compiler, tokenizer, _triggered(stop_after_first=True),
           good=["hi", "hi " + CALL_W], bad=[CALL_W + " more", CALL_W + CALL_T])
    # both: exactly one tag, nothing else
    _check(compiler, tokenizer, _triggered(at_least_one=True, stop_after_first=True),
           good=[CALL_T], bad=["", "x" + CALL_T, CALL_T + "x", CALL_T + CALL_W])


@pytest.mark.model
def test_think_then_tool_calls_and_excludes(compiler: GrammarCompiler, tokenizer: Any) -> None:
    think = {"type": "tag", "begin": "<think>", "content": {"type": "any_text"},
             "end": "</think>"}
    tag = {"format": {"type": "sequence", "elements": [think, {
        **_triggered()["format"], "excludes": ["<think>"]}]}}
    _check(compiler, tokenizer, tag, good=[
        "<think>a < b</think>", "<think>plan</think>Sure." + CALL_W,
        "<think>x</thin</think>" + CALL_T + CALL_W,
    ], bad=["no think", "<think>never closed", "<think>a</think>b<think>", "<think></think>" +
            "<function=nope>"])
    # any_text inside a tag: the first of its ends closes it; its own excludes
    text = {"format": {"type": "tag", "begin": "<r>", "content": {
        "type": "any_text", "excludes": ["bad"]}, "end": ["</r>", "</s>"]}}
    _check(compiler, tokenizer, text, good=["<r>abc de</r>", "<r></s>", "<r>é</r>", "<r></</r>"],
           bad=["<r>a bad</r>", "<r>ab</r>c", "<r>ab</r></r>", "<r>ab"])


@pytest.mark.model
def test_composition_formats(compiler: GrammarCompiler, tokenizer: Any) -> None:
    fmt = {"type": "sequence", "elements": [
        {"type": "const_string", "value": "Answer: "},
        {"type": "or", "elements": [{"type": "regex", "pattern": "[A-Z]{3}-[0-9]{2}"},
                                    {"type": "grammar", "grammar": 'root ::= "yes" | "no"'}]},
        {"type": "repeat", "min": 1, "max": 2, "content": {"type": "const_string",
                                                           "value": "!"}},
        {"type": "optional", "content": {"type": "json_schema", "json_schema": {
            "type": "integer", "minimum": 1, "maximum": 9}}}]}
    _check(compiler, tokenizer, {"format": fmt},
           good=["Answer: ABC-12!", "Answer: yes!!", "Answer: no!7"],
           bad=["Answer: maybe!", "Answer: AB-12!", "Answer: yes", "Answer: yes!!!",
                "Answer: no!0", "answer: yes!"])
    seps = {"format": {"type": "tags_with_separator", "separator": ",", "tags": [
        _tag("<w>", WEATHER, "</w>"), _tag("<t>", TIME, "</t>")]}}
    w, t = '<w>{"city": "X", "unit": "f"}</w>', '<t>{"zone": "CET"}</t>'
    _check(compiler, tokenizer, seps, good=["", w, f"{w},{t},{w}"],
           bad=[f"{w}{t}", f"{w}, {t}", f"x{w}", f"{w},"])
    once = {"format": {**seps["format"], "at_least_one": True, "stop_after_first": True}}
    _check(compiler, tokenizer, once, good=[w, t], bad=["", f"{w},{t}"])


@pytest.mark.model
def test_dispatch_and_straddling_tokens(compiler: GrammarCompiler, tokenizer: Any) -> None:
    rules = [["<n>", {"type": "regex", "pattern": "[0-9]+</n>"}],
             ["<b>", {"type": "const_string", "value": "yes</b>"}]]
    _check(compiler, tokenizer, {"format": {"type": "dispatch", "rules": rules}},
           good=["x <n>42</n> y <b>yes</b>", "plain", "x<n>7</n>"],
           bad=["x <n>4a</n>", "<b>no</b>"])
    _check(compiler, tokenizer, {"format": {"type": "dispatch", "rules": rules, "loop": False}},
           good=["x <n>42</n>", "none"], bad=["<n>1</n> y", "<n>1</n><b>yes</b>"])
    # the real tokenizer writes these across the boundaries: '.<' (text, then the trigger),
    # '>{"' (begin, then JSON), '"}' and '</' (JSON, then the end)
    ids = tokenizer.encode('ok.<function=get_time>{"zone": "UTC"}</function>',
                           add_special_tokens=False)
    pieces = [tokenizer.decode([i]) for i in ids]
    assert any(p.startswith(".<") or p == ".<" for p in pieces), pieces
    _check(compiler, tokenizer, LEGACY, good=['ok.<function=get_time>{"zone": "UTC"}</function>'],
           bad=[])


# -- front end: refusals name the format type or keyword and its path -------------------------
def _refusal(tag: Any) -> GrammarError:
    with pytest.raises(GrammarError) as e:
        SpecBuilder(GrammarConfig()).spec("structural_tag", tag)
    return e.value


def _legacy(schema: Any = None, triggers: Any = ("<f=",), begin: str = "<f=a>") -> Any:
    return {"type": "structural_tag", "triggers": list(triggers), "structures": [
        {"begin": begin, "schema": {"type": "object"} if schema is None else schema,
         "end": "</f>"}]}


@pytest.mark.parametrize("tag, path, words", [
    ([1], "$", "must be an object"),
    ({"type": "json_schema", "format": {}}, "$.type", "structural_tag"),
    ({"type": "structural_tag"}, "$", "needs 'format'"),
    ({"format": {"type": "any_text"}, "triggers": ["<f="]}, "$", "not both"),
    (_legacy(triggers=()), "$.triggers", "non-empty list"),
    (_legacy(triggers=("<f=", "<g=")), "$.triggers[1]", "no tag's begin starts with the trigger"),
    (_legacy(begin="<x=a>"), "$.structures[0].begin", "starts with none of the triggers"),
    (_legacy(triggers=("<f=", "f=")), "$.triggers[0]", "contains the trigger 'f='"),
    ({"triggers": ["<f="], "structures": [{"begin": "<f=a>", "end": "</f>"}]},
     "$.structures[0].schema", "is required"),
    ({"format": {"type": "sequence", "elements": [{"type": "json"}]}},
     "$.format.elements[0].type", "unknown format type 'json'"),
    ({"format": {"type": "token", "token": "<|x|>"}}, "$.format", "'token' is not supported"),
    ({"format": {"type": "tag", "begin": {"type": "token", "token": 5}, "end": "x",
                 "content": {"type": "any_text"}}}, "$.format.begin", "a token as 'begin'"),
    ({"format": {"type": "json_schema", "json_schema": {}, "style": "qwen_xml"}},
     "$.format.style", "'qwen_xml' is not supported"),
    ({"format": {"type": "any_text", "max_tokens": 10}}, "$.format.max_tokens", "length bound"),
    ({"format": {"type": "any_text", "max_chars": 10}}, "$.format.max_chars", "length bound"),
    ({"format": {"type": "repeat", "min": 2000, "max": -1, "content": {
        "type": "const_string", "value": "a"}}}, "$.format.min", "from 0 to 1024"),
    ({"format": {"type": "any_text", "exclude": ["x"]}}, "$.format.exclude", "unknown field"),
    ({"format": {"type": "sequence", "elements": [{"type": "any_text"}, {
        "type": "const_string", "value": "a"}]}}, "$.format.elements[0]", "'any_text' is free"),
    ({"format": {"type": "star", "content": {"type": "triggered_tags", "triggers": ["<"],
                                             "tags": [_tag("<a>", {})]}}},
     "$.format.content", "'triggered_tags' is free text"),
    ({"format": {"type": "repeat", "min": 3, "max": 2, "content": {
        "type": "const_string", "value": "a"}}}, "$.format.max", "at least min"),
    ({"format": {"type": "regex", "pattern": "a(b"}}, "$.format.pattern", "invalid regex"),
    ({"format": {"type": "grammar", "grammar": 'x ::= "a"'}}, "$.format.grammar", "root ::="),
])
def test_refusals_name_the_path(tag: Any, path: str, words: str) -> None:
    e = _refusal(tag)
    assert e.path == path, e
    assert words in str(e) and str(e).startswith(path), e


def test_schemas_inside_pass_the_json_schema_front_end() -> None:
    bad = _refusal(_legacy({"type": "object", "properties": {"a": {"type": "strin"}}}))
    assert isinstance(bad, SchemaValidationError)
    assert bad.path == "$.structures[0].schema.properties.a.type"
    assert str(bad).startswith("$.structures[0].schema: invalid JSON Schema at $.properties.a")
    deep = _refusal({"format": {"type": "tag", "begin": "<a>", "end": "</a>", "content": {
        "type": "json_schema", "json_schema": {"type": "array", "uniqueItems": True}}}})
    assert isinstance(deep, UnsupportedSchemaError)
    assert deep.path == "$.format.content.json_schema.uniqueItems"
    # the same closing rewrites as response_format: no invented keys
    spec = SpecBuilder(GrammarConfig()).spec("structural_tag", _legacy({
        "type": "object", "properties": {"a": {"type": "integer"}}}))
    schema = json.loads(spec.source)["format"]["tags"][0]["content"]["json_schema"]
    assert schema["additionalProperties"] is False
    assert schema["properties"]["a"]["maximum"] == 2**53 - 1
