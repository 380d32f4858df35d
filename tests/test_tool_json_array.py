"""The ``json_array`` tool-call format: its grammar on the SmolLM2 tokenizer, its parser
(streamed == whole), the prompt and history it renders, and the server's choice of format."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_fsm_tools import EOS, TOOLS
from walk_helpers import walk_jump_forward

from grammarserve.errors import GrammarError
from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.conformance import walk
from grammarserve.openai.protocol import ChatCompletionRequest, ChatMessage
from grammarserve.openai.render import render_chat
from grammarserve.openai.toolparse_array import JsonArrayParser, make_parser, parse_calls
from grammarserve.openai.translate import constraint_plan, tools_plan

W = '{"name": "get_weather", "parameters": {"city": "Rome", "unit": "c"}}'
S = '{"name": "search", "parameters": {"q": "pizza", "n": 3}}'


@pytest.fixture(scope="module")
def compiler(tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer)


def walks(compiler: GrammarCompiler, tokenizer: Any, grammar: Any, text: str) -> tuple[bool, str]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return walk(grammar.matcher(), ids, EOS, compiler.allocate_bitmask(1))


@pytest.mark.parametrize("text", [
    f"[{W}]", f"[{W}]\n", f"[{S}, {W}]",
    json.dumps([json.loads(S), json.loads(W), json.loads(S)], separators=(",", ":")),
    f'[{W.replace("Rome", "日本")}]',
    '[{"name": "search", "parameters": {"q": "a]}"}}]',  # brackets inside a string
])
@pytest.mark.model
def test_array_grammar_accepts(compiler: GrammarCompiler, tokenizer: Any, text: str) -> None:
    """Generated as the engine does (forced spans in their canonical tokens: inside a forced
    stretch such as ``"}},{"`` llguidance offers only those)."""
    import xgrammar as xgr

    grammar = compiler.compile_tool_calls(TOOLS, "required", call_format="json_array")
    token_bytes = xgr.TokenizerInfo.from_huggingface(tokenizer).decoded_vocab
    ok, reason, _ = walk_jump_forward(grammar.matcher(), text, tokenizer,
                                      compiler.allocate_bitmask(1), EOS, token_bytes)
    assert ok, reason


@pytest.mark.parametrize("text", [
    "[]",  # at least one call
    W,  # not in an array
    f"[{W.replace('parameters', 'arguments')}]",  # the Hermes key
    f"[{W.replace('get_weather', 'get_time')}]",  # unknown tool
    f"[{S.replace('3', '0')}]",  # below the minimum
    f"[{W}] and text",
    f"Sure: [{W}]",
    f"<tool_call>\n{W}\n</tool_call>",
    f"[{W}",  # the stop token before the array closed
])
@pytest.mark.model
def test_array_grammar_refuses(compiler: GrammarCompiler, tokenizer: Any, text: str) -> None:
    grammar = compiler.compile_tool_calls(TOOLS, "required", call_format="json_array")
    ok, reason = walks(compiler, tokenizer, grammar, text)
    assert not ok and "masked out" in reason, reason


@pytest.mark.model
def test_array_single_and_named(compiler: GrammarCompiler, tokenizer: Any) -> None:
    single = compiler.compile_tool_calls(TOOLS, "required", parallel=False,
                                         call_format="json_array")
    assert walks(compiler, tokenizer, single, f"[{S}]")[0]
    assert not walks(compiler, tokenizer, single, f"[{S}, {W}]")[0]
    named = compiler.compile_tool_calls(TOOLS, {"type": "function", "function": {
        "name": "search"}}, call_format="json_array")
    assert walks(compiler, tokenizer, named, f"[{S}]")[0]
    assert not walks(compiler, tokenizer, named, f"[{W}]")[0]


@pytest.mark.model
def test_array_format_errors(tokenizer: Any) -> None:
    compiler = GrammarCompiler(tokenizer)
    with pytest.raises(GrammarError, match="no 'auto' mode"):
        compiler.compile_tool_calls(TOOLS, "auto", call_format="json_array")
    with pytest.raises(GrammarError, match="format must be one of"):
        compiler.compile_tool_calls(TOOLS, "required", call_format="xml")


# -- parsing ----------------------------------------------------------------------------------
ARRAY = f'[{W}, {S} ,\n{{"name": "search", "parameters": {{"q": "]}}\\""}}}}]\n'


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_parser_streamed_equals_whole(size: int) -> None:
    content, calls = parse_calls(ARRAY, "json_array")
    assert content is None
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Rome", "unit": "c"}), ("search", {"q": "pizza", "n": 3}),
        ("search", {"q": ']}"'})]
    parser = make_parser("json_array")
    assert isinstance(parser, JsonArrayParser)
    events = []
    for i in range(0, len(ARRAY), size):
        events += parser.feed(ARRAY[i:i + size])
    events += parser.finish()
    assert [(c.name, c.arguments) for c in parser.calls] == [(c.name, c.arguments) for c in calls]
    streamed: dict[int, str] = {}
    for ev in events:
        if hasattr(ev, "text") and hasattr(ev, "index"):
            streamed[ev.index] = streamed.get(ev.index, "") + ev.text
    assert [streamed[i] for i in range(3)] == [c.arguments for c in calls]


def test_parser_unclosed_array_and_plain_text() -> None:
    """A reply that ended at a repeated call (no ``]``) keeps its complete calls."""
    assert [c.name for c in parse_calls(f"[{W}, {S}", "json_array")[1]] == ["get_weather",
                                                                             "search"]
    assert parse_calls("I cannot help with that.", "json_array") == (
        "I cannot help with that.", [])
    hermes = parse_calls(f"<tool_call>\n{W.replace('parameters', 'arguments')}\n</tool_call>")
    assert [c.name for c in hermes[1]] == ["get_weather"]


# -- prompt and format choice -------------------------------------------------------------------
def _req(**kw: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [
        {"role": "user", "content": "Weather in Rome?"}], "tools": TOOLS, **kw})


def test_format_is_chosen_per_tool_choice() -> None:
    plan = tools_plan(_req(tool_choice="required"), "json_array")
    assert plan is not None and plan.format == "json_array"
    cp = constraint_plan(_req(), plan)
    assert cp is not None and cp.constraint.tool_format == "json_array"
    auto = tools_plan(_req(tool_choice="auto"), "json_array")
    assert auto is not None and auto.format == "hermes"  # the array format has no auto mode
    named = tools_plan(_req(tool_choice={"type": "function", "function": {"name": "search"}}),
                       "json_array")
    assert named is not None and named.format == "json_array"
    assert tools_plan(_req(tool_choice="required")).format == "hermes"  # type: ignore[union-attr]


@pytest.mark.model
def test_render_describes_and_replays_the_array_format(tokenizer: Any) -> None:
    history = [ChatMessage.model_validate(m) for m in [
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {
                "name": "get_weather", "arguments": '{"city": "Rome", "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "user", "content": "And pizza places?"}]]
    text = render_chat(tokenizer, history, tools=TOOLS, tool_choice="required",
                       tool_format="json_array")
    assert '[{"name": <function-name>, "parameters": <args-json-object>}]' in text
    assert '[{"name": "get_weather", "parameters": {"city": "Rome", "unit": "c"}}]' in text
    assert "<tool_call>" not in text and "<tool_response>\nsunny" in text
