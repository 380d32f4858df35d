"""Custom tools without a model: the translation of both APIs' tool bodies and tool_choice to a
plan and a constraint (and the 400s of what is not served), the prompt's description of the
tools and of past custom calls, and the replies (a ``custom`` tool call in chat, a
``custom_tool_call`` item in Responses, streamed and not), checked against the ``openai`` SDK's
own types."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from openai.types.chat import ChatCompletion
from openai.types.responses import Response, ResponseStreamEvent
from openai_helpers import WEATHER, chat_req, engine_outputs, pieces_of
from pydantic import TypeAdapter, ValidationError

from grammarserve.engine.request import RequestOutput
from grammarserve.errors import GrammarError, InvalidRequestError
from grammarserve.fsm.text_grammars import check_lark
from grammarserve.openai import ModelContext, Prepared, completion_body, stream_chunks
from grammarserve.openai.custom_tools import CustomSyntax
from grammarserve.openai.errors import validation_error
from grammarserve.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    NamedCustomToolChoice,
)
from grammarserve.openai.render import render_chat
from grammarserve.openai.responses_reply import response_body, response_events
from grammarserve.openai.responses_request import (
    ResponsesRequest,
    _param,
    chat_request,
    input_messages,
    prepare_response,
)
from grammarserve.openai.sampling import sampling_params
from grammarserve.openai.translate import (
    constraint_plan,
    grammar_error,
    tools_plan,
)
from grammarserve.sampling_params import SamplingParams

CALC_GRAMMAR = 'start: NUM (OP NUM)*\nNUM: /[0-9]+/\nOP: "+" | "-"'
CALC = {"type": "custom", "custom": {"name": "calc", "description": "Arithmetic.", "format": {
    "type": "grammar", "grammar": {"syntax": "lark", "definition": CALC_GRAMMAR}}}}
EMAIL = {"type": "custom", "custom": {"name": "email", "format": {
    "type": "grammar", "grammar": {"syntax": "regex", "definition": r"[a-z]+@[a-z]+\.com"}}}}
NOTE = {"type": "custom", "custom": {"name": "note"}}  # no format: free text
R_CALC = {"type": "custom", "name": "calc", "description": "Arithmetic.",
          "format": {"type": "grammar", "syntax": "lark", "definition": CALC_GRAMMAR}}
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def named(name: str) -> dict[str, Any]:
    return {"type": "custom", "custom": {"name": name}}


def refusal(**kw: Any) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as e:
        req = chat_req(**kw)
        constraint_plan(req, tools_plan(req))
    return e.value


# -- translation -----------------------------------------------------------------------------
@pytest.mark.parametrize(("tool", "kind", "spec"), [
    (CALC, "grammar", CALC_GRAMMAR), (EMAIL, "regex", r"[a-z]+@[a-z]+\.com"), (NOTE, None, None)])
def test_a_named_custom_tool_constrains_the_whole_reply(tool: dict[str, Any], kind: str | None,
                                                        spec: str | None) -> None:
    name = tool["custom"]["name"]
    req = chat_req(tools=[WEATHER, tool], tool_choice=named(name))
    plan = tools_plan(req)
    assert plan is not None and plan.custom is not None and plan.custom.name == name
    assert plan.custom.index == 1 and [c.name for c in plan.customs] == [name]
    assert plan.tools == [WEATHER]  # the function tools, still shown to the model
    constraint = constraint_plan(req, plan)
    if kind is None:
        assert constraint is None  # free text until EOS or max_tokens
    else:
        assert constraint is not None and constraint.constraint.kind == kind
        assert constraint.constraint.spec == spec and constraint.label == name
        assert constraint.param == "tools[1].custom.format.grammar.definition"
        assert constraint.constraint.syntax == "lark"
    params = sampling_params(req, max_tokens=8, plan=constraint, n=1)[0]
    assert params.stop == ()  # no tool-call stop string for a custom input
    assert params.constraint == (constraint.constraint if constraint is not None else None)


def test_required_with_only_a_custom_tool_and_allowed_tools_naming_it_are_named_calls() -> None:
    plan = tools_plan(chat_req(tools=[CALC], tool_choice="required"))
    assert plan is not None and plan.custom is not None and plan.custom.name == "calc"
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "required",
                                                          "tools": [named("calc")]}}
    plan = tools_plan(chat_req(tools=[WEATHER, CALC], tool_choice=allowed))
    assert plan is not None and plan.custom is not None and plan.custom.syntax is CustomSyntax.LARK
    # a named function call beside a custom tool: the custom tool is shown, not callable
    plan = tools_plan(chat_req(tools=[WEATHER, CALC], tool_choice={
        "type": "function", "function": {"name": "get_weather"}}))
    assert plan is not None and plan.custom is None and [c.name for c in plan.customs] == ["calc"]
    c = constraint_plan(chat_req(), plan)
    assert c is not None and c.constraint.kind == "tool_calls" and c.constraint.spec == [WEATHER]


@pytest.mark.parametrize(("choice", "what"), [
    ("auto", "tool_choice 'auto'"), (None, "'auto' (the default)"),
    ("required", "'required' with several tools"),
    ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [named("calc")]}},
     "allowed_tools in mode 'auto'"),
    ({"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        named("calc"), {"type": "function", "function": {"name": "get_weather"}}]}},
     "allowed_tools in mode 'required' with 2 tools"),
])
def test_a_custom_tool_among_choices_is_a_400_naming_tool_choice(choice: Any, what: str) -> None:
    e = refusal(tools=[WEATHER, CALC], tool_choice=choice)
    assert e.param == "tool_choice" and what in str(e)
    assert "'calc'" in str(e) and "type 'custom'" in str(e)


@pytest.mark.parametrize(("fmt", "param", "text"), [
    ({"type": "grammar", "grammar": {"syntax": "ebnf", "definition": "root ::= x"}},
     "tools[0].custom.format.grammar.syntax", "must be 'lark' or 'regex', got 'ebnf'"),
    ({"type": "json"}, "tools[0].custom.format.type", "'text' or 'grammar', got 'json'"),
    ({"type": "grammar"}, "tools[0].custom.format.grammar", "has no 'grammar'"),
    ({"type": "grammar", "grammar": {"syntax": "lark", "definition": " "}},
     "tools[0].custom.format.grammar.definition", "is empty"),
    ({"type": "grammar", "grammar": {"syntax": "lark"}},
     "tools[0].custom.format.grammar.definition", "is missing"),
])
def test_bad_custom_formats_name_the_tool(fmt: dict[str, Any], param: str, text: str) -> None:
    e = refusal(tools=[{"type": "custom", "custom": {"name": "calc", "format": fmt}}],
                tool_choice=named("calc"))
    assert e.param == param and text in str(e) and "'calc'" in str(e)


def test_bad_names_and_choices() -> None:
    e = refusal(tools=[CALC, {"type": "custom", "custom": {"name": "calc"}}],
                tool_choice=named("calc"))
    assert e.param == "tools[1].custom.name" and "already the name" in str(e)
    e = refusal(tools=[{"type": "custom", "custom": {"name": "a b"}}], tool_choice=named("a b"))
    assert e.param == "tools[0].custom.name"
    e = refusal(tools=[WEATHER, CALC], tool_choice=named("get_weather"))
    assert e.param == "tool_choice" and "not a custom tool" in str(e) and "calc" in str(e)
    e = refusal(tools=[CALC], tool_choice={"type": "function", "function": {"name": "calc"}})
    assert e.param == "tool_choice"
    e = refusal(tools=[CALC], tool_choice=named("calc"), response_format={"type": "json_object"})
    assert e.param == "response_format" and "'calc'" in str(e)


def test_a_compile_error_names_the_tool_and_the_grammar_param() -> None:
    req = chat_req(tools=[WEATHER, CALC], tool_choice=named("calc"))
    plan = constraint_plan(req, tools_plan(req))
    assert plan is not None
    with pytest.raises(GrammarError) as e:
        check_lark("start: expr")  # the grammar layer's own message: an undefined rule
    err = grammar_error(e.value, plan)
    assert err.param == "tools[1].custom.format.grammar.definition"
    assert str(err).startswith("tools[1]: invalid grammar for the custom tool 'calc': ")
    assert "expr" in str(err)
    assert _param(err.param) == "tools[1].format.definition"  # as the Responses API names it


def test_errors_inside_a_function_tool_keep_their_param_names() -> None:
    with pytest.raises(ValidationError) as e:
        ChatCompletionRequest.model_validate({"model": "m", "messages": [], "tools": [
            {"type": "function", "function": {"name": "f", "parameters": "x"}}]})
    assert validation_error(e.value.errors(), loc_prefix=()).param == (
        "tools[0].function.parameters")


# -- Responses requests ------------------------------------------------------------------------
def test_responses_custom_tools_and_items_translate_to_chat() -> None:
    r = ResponsesRequest.model_validate({
        "model": "m", "tools": [R_CALC], "tool_choice": {"type": "custom", "name": "calc"},
        "input": [{"role": "user", "content": "1+1?"},
                  {"type": "custom_tool_call", "call_id": "call_1", "name": "calc",
                   "input": "1+1"},
                  {"type": "custom_tool_call_output", "call_id": "call_1", "output": "2"},
                  {"role": "user", "content": "and 2+2?"}]})
    msgs = input_messages(r)
    assert msgs[1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "custom", "custom": {"name": "calc", "input": "1+1"}}]}
    assert msgs[2] == {"role": "tool", "tool_call_id": "call_1", "content": "2"}
    chat = chat_request(r)
    assert chat.tools is not None and chat.tools[0].model_dump(exclude_none=True) == CALC
    assert isinstance(chat.tool_choice, NamedCustomToolChoice)
    assert chat.tool_choice.model_dump() == named("calc")
    plan = tools_plan(chat)
    assert plan is not None and plan.custom is not None and plan.custom.definition == CALC_GRAMMAR


@pytest.mark.parametrize(("tool", "choice", "param"), [
    ({**R_CALC, "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}},
     {"type": "custom", "name": "calc"}, "tools[0].format.syntax"),
    ({**R_CALC, "format": {"type": "grammar", "syntax": "lark"}},
     {"type": "custom", "name": "calc"}, "tools[0].format.definition"),
    ({**R_CALC, "name": "a.b"}, {"type": "custom", "name": "a.b"}, "tools[0].name"),
    (R_CALC, {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "custom",
                                                                  "name": "calc"}]},
     "tool_choice"),
    (R_CALC, "required", None),  # the only tool: a named call
])
def test_responses_errors_name_the_responses_params(tool: dict[str, Any], choice: Any,
                                                    param: str | None) -> None:
    r = ResponsesRequest.model_validate({"model": "m", "input": "hi", "tools": [tool],
                                         "tool_choice": choice})
    ctx = ModelContext.create(None, None, max_model_len=512, max_n=1, model_name="m")
    if param is None:
        plan = tools_plan(chat_request(r))
        assert plan is not None and plan.custom is not None and plan.custom.name == "calc"
        return
    with pytest.raises(InvalidRequestError) as e:
        prepare_response(ctx, r)
    assert e.value.param == param and repr(tool["name"]) in str(e.value)


# -- the prompt ------------------------------------------------------------------------------
class _Tokenizer:
    """A chat template stand-in: messages as ``<role>content`` lines (``tools`` in the template
    when ``with_tools``, which then gets them as ``tools=``)."""

    def __init__(self, with_tools: bool = False) -> None:
        self.chat_template = "{{ tools }}" if with_tools else "{{ messages }}"
        self.kwargs: dict[str, Any] = {}

    def apply_chat_template(self, msgs: list[dict[str, Any]], **kw: Any) -> str:
        self.kwargs = kw
        return "\n".join(f"<{m['role']}>{m['content']}" for m in msgs)


HISTORY = [{"role": "user", "content": "1+1?"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "call_1", "type": "custom", "custom": {"name": "calc", "input": "1+1"}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "2"},
           {"role": "user", "content": "and 2+2?"}]


@pytest.mark.parametrize("with_tools", [False, True])
def test_the_prompt_describes_the_custom_tool_and_past_calls(with_tools: bool) -> None:
    req = chat_req(messages=HISTORY, tools=[WEATHER, CALC], tool_choice=named("calc"))
    plan = tools_plan(req)
    assert plan is not None
    tok = _Tokenizer(with_tools)
    text = render_chat(tok, req.messages, tools=plan.tools, tool_choice=plan.choice,
                       parallel=plan.parallel, customs=plan.customs, custom=plan.custom)
    assert "tools" not in tok.kwargs  # the custom block, not the template's function block
    assert "## Custom tool 'calc'\nArithmetic.\nIts input must match this Lark grammar" in text
    assert f"```lark\n{CALC_GRAMMAR}\n```" in text and '"name": "get_weather"' in text
    assert text.rstrip().endswith("your whole reply is its input, with nothing before or after "
                                  "it.\n<user>1+1?\n<assistant><custom_tool_call name=\"calc\">\n"
                                  "1+1\n</custom_tool_call>\n<user><tool_response>\n2\n"
                                  "</tool_response>\n<user>and 2+2?")
    # a named function call: the template gets the function tools, the custom tool is described
    plan = tools_plan(chat_req(tools=[WEATHER, EMAIL], tool_choice={
        "type": "function", "function": {"name": "get_weather"}}))
    assert plan is not None
    text = render_chat(tok, [ChatMessage.model_validate(HISTORY[0])], tools=plan.tools,
                       tool_choice=plan.choice, customs=plan.customs, custom=plan.custom)
    assert "regular expression:\n```\n[a-z]+@[a-z]+\\.com\n```" in text
    assert "now: your whole reply" not in text
    assert (tok.kwargs.get("tools") == [WEATHER]) == with_tools


# -- replies ---------------------------------------------------------------------------------
def _outputs(text: str, finish: str, cut: int = 3) -> list[RequestOutput]:
    return engine_outputs(pieces_of(text, cut), finish)


def _ctx() -> ModelContext:
    return ModelContext.create(None, None, max_model_len=512, max_n=1, model_name="m")


def _chat_prep(stream: bool = False) -> Prepared:
    req = chat_req(tools=[CALC], tool_choice=named("calc"), stream=stream)
    return Prepared("chatcmpl-t", req, [[1, 2, 3]], [SamplingParams()], None, tools_plan(req),
                    [], None)


async def _replay(outs: list[RequestOutput]):  # type: ignore[no-untyped-def]
    for o in outs:
        yield 0, o


@pytest.mark.parametrize(("text", "finish", "reason"), [
    ("12+30-4", "stop", "tool_calls"), ("12+3", "length", "length"), ("", "stop", "tool_calls")])
def test_chat_replies_are_one_custom_call(text: str, finish: str, reason: str) -> None:
    body = ChatCompletion.model_validate(completion_body(_ctx(), _chat_prep(),
                                                         _outputs(text, finish)[-1:]))
    choice = body.choices[0]
    assert choice.finish_reason == reason and choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1 and calls[0].type == "custom"
    assert calls[0].custom.name == "calc" and calls[0].custom.input == text
    assert calls[0].id.startswith("call_")

    async def collect() -> list[dict[str, Any]]:
        return [c async for c in stream_chunks(_ctx(), _chat_prep(True),
                                               _replay(_outputs(text, finish)))]

    # NOTE: the SDK's chunk type knows function deltas only (it keeps ``custom`` as a dict:
    # tests/test_custom_tools_e2e.py), so the chunks are checked as sent
    chunks = [c["choices"][0] for c in asyncio.run(collect())]
    deltas = [tc for c in chunks for tc in c["delta"].get("tool_calls", [])]
    assert deltas[0] == {"index": 0, "id": deltas[0]["id"], "type": "custom",
                         "custom": {"name": "calc", "input": ""}}
    assert deltas[0]["id"].startswith("call_")
    assert all(set(d) == {"index", "custom"} and d["index"] == 0 for d in deltas[1:])
    assert "".join(d["custom"]["input"] for d in deltas) == text
    assert chunks[0]["delta"] == {"role": "assistant", "content": None, "refusal": None}
    assert [c["finish_reason"] for c in chunks if c["finish_reason"]] == [reason]
    assert not any(c["delta"].get("content") for c in chunks)


@pytest.mark.parametrize(("text", "finish"), [("12+30-4", "stop"), ("12+3", "length")])
def test_responses_replies_are_one_custom_tool_call(text: str, finish: str) -> None:
    r = ResponsesRequest.model_validate({"model": "m", "input": "hi", "tools": [R_CALC],
                                         "tool_choice": {"type": "custom", "name": "calc"}})
    prep = Prepared("resp_t", chat_request(r), [[1, 2, 3]], [SamplingParams()], None,
                    tools_plan(chat_request(r)), [], None)
    status = "completed" if finish == "stop" else "incomplete"
    body = Response.model_validate(response_body(_ctx(), r, prep, _outputs(text, finish)[-1], 0))
    assert body.status == status and len(body.output) == 1
    item = body.output[0]
    assert item.type == "custom_tool_call" and item.name == "calc" and item.input == text
    assert item.call_id.startswith("call_") and item.id is not None and item.id.startswith("ctc_")
    assert item.model_extra == {"status": status}
    assert body.tools[0].type == "custom" and body.tool_choice.type == "custom"  # type: ignore[union-attr]

    async def collect() -> list[dict[str, Any]]:
        return [e async for e in response_events(_ctx(), r, prep, _replay(_outputs(text, finish)))]

    raw = asyncio.run(collect())
    events = [EVENTS.validate_python(e) for e in raw]
    assert [e["sequence_number"] for e in raw] == list(range(len(raw)))
    types = [e.type for e in events]
    deltas = types.count("response.custom_tool_call_input.delta")
    assert types == ["response.created", "response.in_progress", "response.output_item.added",
                     *["response.custom_tool_call_input.delta"] * deltas,
                     "response.custom_tool_call_input.done", "response.output_item.done",
                     "response.completed" if finish == "stop" else "response.incomplete"]
    added, input_done, done = events[2], events[-3], events[-2]
    assert added.item.type == "custom_tool_call" and added.item.input == ""
    assert "".join(e.delta for e in events[3:3 + deltas]) == text == input_done.input
    assert {e.item_id for e in events[3:-2]} == {added.item.id} == {done.item.id}
    assert done.item.input == text and done.item.model_extra == {"status": status}
    assert events[-1].response.output[0].input == text
