"""Custom tools end to end: the official ``openai`` SDK against the real server on the embedded
model. A named custom tool's call comes back with an ``input`` its grammar accepts (parsed here
by the ``lark`` package, or matched by the regex), in both APIs, streamed (the SDK's typed
events) and not; a bad grammar and ``auto`` with a custom tool are 400s naming the tool and
``tool_choice``."""

from __future__ import annotations

import re
from typing import Any

import lark
import openai
import pytest
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseCustomToolCallInputDeltaEvent,
    ResponseCustomToolCallInputDoneEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
)

pytestmark = pytest.mark.model

#: Sums of at most three numbers of at most three digits: a complete input is short, so small
#: ``max_tokens`` budgets cannot cut it.
CALC_GRAMMAR = """start: expr
expr: NUMBER | NUMBER OP NUMBER | NUMBER OP NUMBER OP NUMBER
NUMBER: /[0-9]{1,3}/
OP: "+" | "-"
"""
CALC_PARSER = lark.Lark(CALC_GRAMMAR, start="start")
R_CALC: Any = {"type": "custom", "name": "calc", "description": "Evaluates an arithmetic expression.",
          "format": {"type": "grammar", "syntax": "lark", "definition": CALC_GRAMMAR}}
C_CALC: Any = {"type": "custom", "custom": {
    "name": "calc", "description": "Evaluates an arithmetic expression.",
    "format": {"type": "grammar", "grammar": {"syntax": "lark", "definition": CALC_GRAMMAR}}}}
NOTE: Any = {"type": "custom", "name": "note"}  # no format: free text
EMAIL = r"[a-z]{1,8}@[a-z]{1,8}\.com"
ASK = "What is 12 plus 30? Use the calculator."
BUDGET = 24


@pytest.fixture(scope="module")
def client(e2e_server: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=e2e_server["url"] + "/v1", api_key="none", max_retries=0,
                         timeout=300)


def _parses(text: str) -> None:
    tree = CALC_PARSER.parse(text)  # raises if the grammar does not accept it
    assert tree.data == "start"


def test_responses_custom_call_input_parses_under_its_grammar(client: openai.OpenAI) -> None:
    reply = client.responses.create(model="m", input=ASK, tools=[R_CALC],
                                    tool_choice={"type": "custom", "name": "calc"},
                                    max_output_tokens=BUDGET, temperature=0)
    assert reply.status == "completed", reply
    assert [o.type for o in reply.output] == ["custom_tool_call"]
    call = reply.output[0]
    assert call.type == "custom_tool_call" and call.name == "calc"
    assert call.call_id.startswith("call_") and call.id is not None and call.id.startswith("ctc_")
    _parses(call.input)
    assert reply.tools[0].type == "custom" and reply.tool_choice.type == "custom"  # type: ignore[union-attr]
    assert reply.usage is not None and reply.usage.output_tokens <= BUDGET


def test_responses_streamed_custom_call_is_the_sdk_event_types(client: openai.OpenAI) -> None:
    events = list(client.responses.create(
        model="m", input=ASK, tools=[R_CALC], tool_choice={"type": "custom", "name": "calc"},
        stream=True, max_output_tokens=BUDGET, temperature=0))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    added, done, item_done, completed = events[2], *events[-3:]
    deltas = [e for e in events[3:-3] if isinstance(e, ResponseCustomToolCallInputDeltaEvent)]
    assert deltas and len(deltas) == len(events) - 6  # nothing else between added and done
    assert isinstance(added, ResponseOutputItemAddedEvent)
    assert added.item.type == "custom_tool_call" and added.item.input == ""
    assert isinstance(done, ResponseCustomToolCallInputDoneEvent)
    assert isinstance(item_done, ResponseOutputItemDoneEvent)
    assert isinstance(completed, ResponseCompletedEvent)
    text = "".join(e.delta for e in deltas)
    assert text == done.input == item_done.item.input  # type: ignore[union-attr]
    assert {e.item_id for e in deltas} == {done.item_id} == {added.item.id}
    final = completed.response.output
    assert len(final) == 1 and final[0].type == "custom_tool_call" and final[0].input == text
    _parses(text)


def test_responses_stream_helper_accumulates_the_custom_call(client: openai.OpenAI) -> None:
    with client.responses.stream(model="m", input=ASK, tools=[R_CALC], temperature=0,
                                 tool_choice={"type": "custom", "name": "calc"},
                                 max_output_tokens=BUDGET) as stream:
        deltas = [e.delta for e in stream if e.type == "response.custom_tool_call_input.delta"]
        final = stream.get_final_response()
    call = final.output[0]
    assert call.type == "custom_tool_call" and call.input == "".join(deltas)
    _parses(call.input)


def test_chat_custom_call_and_its_stream(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": ASK}],
                          "tools": [C_CALC], "max_tokens": BUDGET, "temperature": 0,
                          "tool_choice": {"type": "custom", "custom": {"name": "calc"}}}
    reply = client.chat.completions.create(**kw)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1 and calls[0].type == "custom"
    assert calls[0].custom.name == "calc" and calls[0].id.startswith("call_")
    _parses(calls[0].custom.input)
    chunks = list(client.chat.completions.create(stream=True, **kw))
    deltas = [tc for c in chunks for ch in c.choices for tc in ch.delta.tool_calls or []]
    # NOTE: the SDK's chunk type knows function deltas only: ``custom`` comes as a dict
    assert deltas[0].type == "custom"  # type: ignore[comparison-overlap]
    assert deltas[0].id is not None and deltas[0].id.startswith("call_")
    assert deltas[0].model_extra == {"custom": {"name": "calc", "input": ""}}
    text = "".join(d.model_extra["custom"]["input"] for d in deltas)  # type: ignore[index]
    assert text == calls[0].custom.input  # greedy: the same input as not streamed
    reasons = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    assert reasons == ["tool_calls"]
    assert not any(ch.delta.content for c in chunks for ch in c.choices)


def test_regex_custom_tool(client: openai.OpenAI) -> None:
    tool: Any = {"type": "custom", "custom": {"name": "send", "description": "Sends a mail.",
                                         "format": {"type": "grammar", "grammar": {
                                             "syntax": "regex", "definition": EMAIL}}}}
    reply = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Mail bob at example dot com."}],
        tools=[tool], tool_choice="required", max_tokens=BUDGET, temperature=0)
    calls = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls" and calls is not None
    assert calls[0].type == "custom" and calls[0].custom.name == "send"
    assert re.fullmatch(EMAIL, calls[0].custom.input), calls[0].custom.input


def test_text_custom_tool_cut_by_max_tokens_and_past_calls(client: openai.OpenAI) -> None:
    reply = client.responses.create(
        model="m", tools=[NOTE, R_CALC], tool_choice={"type": "custom", "name": "note"},
        input=[{"role": "user", "content": ASK},
               {"type": "custom_tool_call", "call_id": "call_1", "name": "calc",
                "input": "12+30"},
               {"type": "custom_tool_call_output", "call_id": "call_1", "output": "42"},
               {"role": "user", "content": "Write a long note about the result."}],
        max_output_tokens=4, temperature=0)
    assert reply.status == "incomplete" and reply.incomplete_details is not None
    assert [o.type for o in reply.output] == ["custom_tool_call"]
    assert reply.output[0].name == "note" and reply.output[0].input  # type: ignore[union-attr]
    assert reply.usage is not None and reply.usage.output_tokens == 4


def test_a_bad_grammar_is_a_400_naming_the_tool(client: openai.OpenAI) -> None:
    bad: Any = {"type": "custom", "name": "calc", "format": {
        "type": "grammar", "syntax": "lark", "definition": "start: expr\n"}}
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="m", input=ASK, tools=[bad],
                                tool_choice={"type": "custom", "name": "calc"},
                                max_output_tokens=BUDGET)
    err = e.value.body
    assert isinstance(err, dict), err
    assert err["param"] == "tools[0].format.definition", err
    assert "custom tool 'calc'" in err["message"], err
    assert "Rule 'expr' used but not defined" in err["message"], err
    bad_chat: Any = {"type": "custom", "custom": {"name": "calc", "format": {
        "type": "grammar", "grammar": {"syntax": "lark", "definition": 'start: "a" (\n'}}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": ASK}],
                                       tools=[bad_chat], tool_choice="required")
    err = e.value.body
    assert isinstance(err, dict), err
    assert err["param"] == "tools[0].custom.format.grammar.definition", err
    assert "custom tool 'calc'" in err["message"], err
    assert "Unclosed parenthesis, at line 1 column 13" in err["message"], err


def test_auto_with_a_custom_tool_is_a_400_naming_tool_choice(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="m", input=ASK, tools=[R_CALC],
                                tool_choice="auto", max_output_tokens=BUDGET)
    err = e.value.body
    assert isinstance(err, dict), err
    assert err["param"] == "tool_choice" and err["type"] == "invalid_request_error", err
    assert "'auto'" in err["message"] and "'calc'" in err["message"], err
