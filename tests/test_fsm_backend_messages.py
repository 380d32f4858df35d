"""The backends' messages in our terms (issue 33 item 5, ``fsm/backends/messages.py``): a limit
names this server's setting and the widest part of the schema, a pattern a backend cannot read
names its JSON path; none of llguidance's internals reach the client."""

from __future__ import annotations

import json
from typing import Any

import pytest

from grammarserve.errors import GrammarError
from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.backends.messages import translate
from grammarserve.fsm.config import GrammarSpec
from grammarserve.fsm.conformance import walk

EOS = 2
WIDE = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(2000)}}


@pytest.mark.model
@pytest.mark.parametrize("style", ["auto", "compact"])
def test_two_thousand_optional_properties_name_the_limit_and_the_place(
        tokenizer: Any, style: str) -> None:
    compiler = GrammarCompiler(tokenizer, backend="llguidance", background_upgrade=False,
                               json_style=style, compile_threads=1)
    matcher = compiler.compile_json_schema(WIDE).matcher()
    ids = list(tokenizer.encode('{"p1":1}', add_special_tokens=False))
    ok, _ = walk(matcher, ids, EOS, compiler.allocate_bitmask(1))
    message = matcher.error() or ""
    assert not ok
    assert "max_items_in_row" in message and "2000" in message
    assert "$.properties (2000 optional properties)" in message
    assert "Parser Error" not in message and "left-recursive" not in message


def test_a_row_limit_message() -> None:
    spec = GrammarSpec("json_schema", json.dumps(WIDE), origin=WIDE)
    raw = ("Parser Error: Current row has 7999 items; max is 2000; consider making your grammar "
           "left-recursive if it's right-recursive\n<state>\nTokens: ...")
    ours = translate(raw, spec, "llguidance")
    assert ours.limit and ours.path == "$.properties"
    assert "7999" in ours.message and "<state>" not in ours.message


def test_a_rust_regex_error_names_the_pattern_and_its_path() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^x$"},
                                               "v": {"type": "string", "pattern": r"\Aab\Z"}}}
    spec = GrammarSpec("json_schema", json.dumps(schema), origin=schema)
    raw = ("regex parse error:\n    \\Aab\\Z\n        ^^\nerror: unrecognized escape sequence")
    ours = translate(raw, spec, "llguidance")
    assert ours.path == "$.properties.v.pattern"
    assert ours.message == ("the grammar backend (llguidance) cannot read the pattern "
                            "'\\\\Aab\\\\Z' at $.properties.v.pattern: unrecognized escape "
                            "sequence at position 4")


def test_an_xgrammar_regex_error_names_the_one_pattern() -> None:
    schema = {"type": "string", "pattern": "^a{,2}$"}
    spec = GrammarSpec("json_schema", json.dumps(schema), origin=schema)
    raw = ("[21:56:58] /project/cpp/regex_converter.cc:94: Regex parsing error at position 4: "
           "Invalid repetition count.")
    ours = translate(raw, spec, "xgrammar")
    assert ours.path == "$.pattern" and "regex_converter" not in ours.message
    assert ours.message.endswith("Invalid repetition count at position 4")


def test_an_unknown_message_is_kept() -> None:
    assert translate("something else\n<state>x", None, "llguidance").message == "something else"


@pytest.mark.model
@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_a_pattern_the_backend_cannot_read_is_a_refusal_with_its_path(
        tokenizer: Any, backend: str) -> None:
    compiler = GrammarCompiler(tokenizer, backend=backend, background_upgrade=False,
                               compile_threads=1)
    with pytest.raises(GrammarError) as e:
        compiler.compile_json_schema({"type": "object", "properties": {
            "v": {"type": "string", "pattern": "^a{,2}$"}}})
    assert e.value.path == "$.properties.v.pattern"
    assert "regex parse error" not in str(e.value) and "regex_converter" not in str(e.value)
