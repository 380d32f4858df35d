"""Request side of the OpenAI protocol layer without a model: translation (tools plan,
constraint plan, sampling params, refusals) and chat rendering (tests marked ``model`` read the
SmolLM2 tokenizer)."""

from __future__ import annotations

from typing import Any

import pytest
from openai_helpers import SEARCH, WEATHER, chat_req

from grammarserve.errors import GrammarError, InvalidRequestError, StrictSchemaError
from grammarserve.openai.logprobs import TokenTexts
from grammarserve.openai.protocol import ChatMessage, CompletionRequest
from grammarserve.openai.render import hermes_messages, openai_messages, render_chat
from grammarserve.openai.sampling import max_new_tokens, sampling_params
from grammarserve.openai.translate import (
    ToolsPlan,
    check_chat_logprobs,
    check_common,
    check_json_mode,
    constraint_plan,
    grammar_error,
    tools_plan,
)


# -- translation -----------------------------------------------------------------------------
def test_tools_plan_modes() -> None:
    assert tools_plan(chat_req()) is None
    assert tools_plan(chat_req(tools=[WEATHER], tool_choice="none")) is None
    plan = tools_plan(chat_req(tools=[WEATHER, SEARCH]))
    assert plan is not None and plan.choice == "auto" and plan.parallel
    named = tools_plan(chat_req(tools=[WEATHER, SEARCH], parallel_tool_calls=True, tool_choice={
        "type": "function", "function": {"name": "search"}}))
    assert named is not None and named.choice["function"]["name"] == "search"
    assert not named.parallel
    allowed = tools_plan(chat_req(tools=[WEATHER, SEARCH], tool_choice={
        "type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
            {"type": "function", "function": {"name": "search"}}]}}))
    assert allowed is not None and allowed.choice == "required"
    assert [t["function"]["name"] for t in allowed.tools] == ["search"]
    with pytest.raises(InvalidRequestError, match="'nope', which is not in 'tools'") as e:
        tools_plan(chat_req(tools=[WEATHER], tool_choice={"type": "function",
                                                          "function": {"name": "nope"}}))
    assert e.value.param == "tool_choice"
    with pytest.raises(InvalidRequestError) as e:
        tools_plan(chat_req(tool_choice="required"))
    assert e.value.param == "tool_choice"


def test_constraint_plan_sources() -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "P", "schema": {"type": "object"},
                                                 "strict": True}}
    plan = constraint_plan(chat_req(response_format=rf), None)
    assert plan is not None and plan.constraint.kind == "json_schema" and plan.constraint.strict
    assert plan.label == "P"
    legacy = constraint_plan(chat_req(response_format={"type": "json_object", "schema": {
        "type": "object", "properties": {"a": {"type": "integer"}}}}), None)
    assert legacy is not None and legacy.constraint.spec["properties"]["a"]["type"] == "integer"
    assert constraint_plan(chat_req(response_format={"type": "text"}), None) is None
    for key, value, kind in [("regex", "[0-9]+", "regex"), ("grammar", 'start: "a"', "grammar"),
                             ("choice", ["yes", "no"], "choice")]:
        plan = constraint_plan(chat_req(**{key: value}), None)
        assert plan is not None and plan.constraint.kind == kind and plan.param == key
    with pytest.raises(InvalidRequestError, match="only one"):
        constraint_plan(chat_req(regex="a", choice=["a"]), None)
    tools = ToolsPlan([WEATHER], "required", True)
    both = constraint_plan(chat_req(response_format=rf), tools)
    assert both is not None and both.constraint.kind == "tool_calls"
    with pytest.raises(InvalidRequestError, match="tool_choice 'auto'"):
        constraint_plan(chat_req(response_format=rf), ToolsPlan([WEATHER], "auto", True))
    with pytest.raises(InvalidRequestError) as e:
        constraint_plan(chat_req(response_format={"type": "json_schema", "json_schema": {
            "name": "bad name!", "schema": {}}}), None)
    assert e.value.param == "response_format.json_schema.name"


@pytest.mark.parametrize("body, param", [
    ({"n": 9}, "n"), ({"stream_options": {}}, "stream_options"),
    ({"stop": ["a", ""]}, "stop"), ({"guided_json": {}}, "guided_json"),
    ({"functions": [{"name": "f"}]}, "functions"),
])
def test_check_common_refusals(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        check_common(chat_req(**body), max_n=8)
    assert e.value.param == param


def test_unknown_standard_fields_are_ignored() -> None:
    req = chat_req(store=False, metadata={"a": "b"}, service_tier="auto", user="u",
                   prompt_cache_key="k", frequency_penalty=0, presence_penalty=None)
    check_common(req, max_n=8)
    check_chat_logprobs(chat_req(logprobs=True, top_logprobs=0))
    check_chat_logprobs(chat_req(logprobs=True, top_logprobs=2))


def test_sampling_params_and_budget() -> None:
    req = chat_req(temperature=0.5, top_p=0.9, seed=7, stop="END", n=2)
    p = sampling_params(req, max_tokens=12, plan=None, n=2)
    assert [x.seed for x in p] == [7, 8] and p[0].temperature == 0.5 and p[0].top_p == 0.9
    assert p[0].stop == ("END",) and p[0].max_tokens == 12
    tools = constraint_plan(chat_req(), ToolsPlan([WEATHER], "required", True))
    with_tools = sampling_params(chat_req(stop="x"), max_tokens=4, plan=tools, n=1)[0]
    assert with_tools.stop == ("x", "</tool_call>\n\n")
    greedy = sampling_params(chat_req(top_p=0), max_tokens=4, plan=None, n=1)[0]
    assert greedy.greedy
    assert sampling_params(chat_req(), max_tokens=4, plan=None, n=1)[0].temperature == 1.0
    assert max_new_tokens(None, 100, 1000) == 900
    assert max_new_tokens(50, 100, 1000) == 50
    with pytest.raises(InvalidRequestError, match="maximum context length is 1000") as e:
        max_new_tokens(901, 100, 1000)
    assert e.value.param == "messages"
    with pytest.raises(InvalidRequestError):
        max_new_tokens(None, 1000, 1000)


def test_json_mode_needs_the_word_json() -> None:
    req = chat_req(response_format={"type": "json_object"})
    with pytest.raises(InvalidRequestError) as e:
        check_json_mode(req, ["hello"])
    assert e.value.param == "messages"
    check_json_mode(req, ["Answer in JSON."])


def test_grammar_errors_name_the_field() -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "Person", "schema": {}}}
    plan = constraint_plan(chat_req(response_format=rf), None)
    assert plan is not None
    err = grammar_error(StrictSchemaError("Invalid schema: In context=(), 'x'.", path="$"), plan)
    assert str(err) == "Invalid schema for response_format 'Person': In context=(), 'x'."
    assert err.param == "response_format"
    tools = constraint_plan(chat_req(), ToolsPlan([WEATHER], "required", True))
    assert tools is not None
    err = grammar_error(GrammarError("bad", path="$.tools[0].function.parameters.properties.a"),
                        tools)
    assert err.param == "tools[0].function.parameters"


def test_completion_prompt_shapes() -> None:
    for prompt in ("text", ["a", "b"], [1, 2, 3], [[1, 2], [3]]):
        CompletionRequest.model_validate({"model": "m", "prompt": prompt})
    assert CompletionRequest.model_validate({"model": "m", "prompt": "x"}).max_tokens == 16


# -- rendering -------------------------------------------------------------------------------
HISTORY = [
    {"role": "developer", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris"},
                                 {"type": "text", "text": "and Rome?"}]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "rain"}]},
]


def test_hermes_rendering_of_tool_history() -> None:
    msgs = hermes_messages(openai_messages([ChatMessage.model_validate(m) for m in HISTORY]),
                           "TOOLS")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[0]["content"] == "Be brief.\n\nTOOLS"
    assert msgs[1]["content"] == "Weather in Paris\nand Rome?"
    assert msgs[2]["content"] == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>')
    assert msgs[3]["content"] == ("<tool_response>\nsunny\n</tool_response>\n"
                                  "<tool_response>\nrain\n</tool_response>")


def test_message_content_errors() -> None:
    with pytest.raises(InvalidRequestError) as e:
        openai_messages([ChatMessage.model_validate(
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]})])
    assert e.value.param == "messages[0].content[0].type"
    with pytest.raises(InvalidRequestError) as e:
        openai_messages([])
    assert e.value.param == "messages"


@pytest.mark.model
def test_render_chat_with_tools_through_the_template(tokenizer) -> None:  # type: ignore[no-untyped-def]
    msgs = [ChatMessage.model_validate(m) for m in HISTORY]
    text = render_chat(tokenizer, msgs, tools=[WEATHER], tool_choice="required")
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert '"name": "get_weather"' in text and "You must call at least one" in text
    assert text.endswith("<|im_start|>assistant\n")
    plain = render_chat(tokenizer, msgs[1:2])
    assert "# Tools" not in plain and "You are a helpful AI assistant" in plain


@pytest.mark.model
def test_token_texts_give_exact_bytes(tokenizer) -> None:  # type: ignore[no-untyped-def]
    texts = TokenTexts(tokenizer)
    ids = tokenizer.encode("héllo wörld ✓", add_special_tokens=False)
    data = b"".join(bytes(texts.get(i)[1]) for i in ids)
    assert data.decode("utf-8") == "héllo wörld ✓"
    assert texts.get(tokenizer.eos_token_id)[0] == "<|im_end|>"


def test_top_k_beyond_int64_is_a_400() -> None:
    """Found fuzzing (GRAMMARSERVE_FUZZ_EXAMPLES=500): top_k = 2**64 reached the sampler, whose
    int64 tensor overflowed in the engine step (failing every request in flight)."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate({"model": "m", "prompt": "x", "top_k": 2**64})
    assert info.value.errors()[0]["loc"] == ("top_k",)
    req = chat_req(top_k=2**63 - 1)  # the largest accepted: the same as off
    params = sampling_params(req, max_tokens=4, plan=None, n=1)
    assert params[0].top_k == 2**63 - 1
