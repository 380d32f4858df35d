"""The Responses API without a model: request translation (input items, text.format, tools,
refused stateful fields, parameter names in errors) and the reply shapes, checked against the
``openai`` SDK's own types (the response object and every stream event)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from openai_helpers import engine_outputs, pieces_of
from pydantic import TypeAdapter

from grammarserve.engine.request import RequestOutput
from grammarserve.errors import ErrorKind, InvalidRequestError, RequestFailedError
from grammarserve.openai import ModelContext, Prepared
from grammarserve.openai.responses_reply import response_body, response_events
from grammarserve.openai.responses_request import (
    ResponsesRequest,
    chat_request,
    check_stateless,
    input_messages,
)
from grammarserve.openai.translate import ToolsPlan
from grammarserve.sampling_params import SamplingParams

TOOL = {"type": "function", "name": "get_weather", "strict": True, "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
    "additionalProperties": False}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def req(**kw: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": "hi", **kw})


def test_input_items_become_chat_messages() -> None:
    r = req(instructions="Be brief.", input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather",
         "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "It is sunny."}]}])
    msgs = input_messages(r)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant"]
    assert [c["id"] for c in msgs[2]["tool_calls"]] == ["call_1", "call_2"]  # one turn
    assert msgs[3] == {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    assert input_messages(req(input="x")) == [{"role": "user", "content": "x"}]


def test_text_format_and_tools_translate_to_chat() -> None:
    chat = chat_request(req(text={"format": {"type": "json_schema", "name": "City", "strict": True,
                                             "schema": {"type": "object"}}},
                            tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"},
                            max_output_tokens=32, temperature=0.5, top_p=0.9))
    rf = chat.response_format
    assert rf is not None and rf.json_schema is not None and rf.json_schema.name == "City"
    assert rf.json_schema.strict and rf.json_schema.schema_ == {"type": "object"}
    assert chat.tools is not None and chat.tools[0].function.name == "get_weather"
    assert chat.tools[0].function.parameters == TOOL["parameters"]
    assert chat.tool_choice is not None and chat.tool_choice.function.name == "get_weather"  # type: ignore[union-attr]
    assert (chat.max_completion_tokens, chat.temperature, chat.top_p) == (32, 0.5, 0.9)


@pytest.mark.parametrize(("fields", "param"), [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"background": True}, "background"),
])
def test_stateful_and_foreign_fields_are_refused(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        check_stateless(req(**fields))
    assert e.value.param == param and param in str(e.value)


@pytest.mark.parametrize(("item", "param"), [
    ({"role": "user", "content": [{"type": "input_image", "image_url": "x"}]},
     "input[0].content[0].type"),
    ({"type": "item_reference", "id": "msg_1"}, "input[0].type"),
    ({"role": "tool", "content": "x"}, "input[0].role"),
])
def test_bad_input_items_name_the_item(item: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        input_messages(req(input=[item]))
    assert e.value.param == param


def _prepared(r: ResponsesRequest, tools: bool) -> Prepared:
    return Prepared("resp_test", chat_request(r), [[1, 2, 3]], [SamplingParams()], None,
                    ToolsPlan([{"type": "function", "function": {"name": "get_weather"}}],
                              "required", True, "hermes") if tools else None, [], None)


def _outputs(text: str, finish: str, cut: int = 7) -> list[RequestOutput]:
    return engine_outputs(pieces_of(text, cut), finish)


def _events(r: ResponsesRequest, prep: Prepared, outs: list[RequestOutput]
            ) -> list[dict[str, Any]]:
    ctx = ModelContext.create(None, None, max_model_len=512, max_n=1, model_name="m")

    async def replay():  # type: ignore[no-untyped-def]
        for o in outs:
            yield 0, o

    async def collect() -> list[dict[str, Any]]:
        return [e async for e in response_events(ctx, r, prep, replay())]

    return asyncio.run(collect())


@pytest.mark.parametrize(("text", "finish", "tools"), [
    ("Paris is in France.", "stop", False),
    ("", "stop", False),
    ("Paris is in", "length", False),
    ("\n" + CALL + "\n" + CALL.replace("Paris", "Rome"), "stop", True),
])
def test_stream_events_parse_as_the_sdk_types(text: str, finish: str, tools: bool) -> None:
    r = req(tools=[TOOL] if tools else None, tool_choice="required" if tools else None)
    prep = _prepared(r, tools)
    events = _events(r, prep, _outputs(text, finish))
    parsed = [EVENTS.validate_python(e) for e in events]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert parsed[0].type == "response.created" and parsed[1].type == "response.in_progress"
    final = parsed[-1].response
    assert parsed[-1].type == ("response.completed" if finish == "stop"
                               else "response.incomplete")
    assert final.usage.output_tokens == len(_outputs(text, finish)) and final.id == "resp_test"
    if tools:
        calls = [o for o in final.output if o.type == "function_call"]
        assert [json.loads(c.arguments)["city"] for c in calls] == ["Paris", "Rome"]
        for c in calls:  # the deltas of each call add up to its arguments
            deltas = [e.delta for e in parsed
                      if e.type == "response.function_call_arguments.delta" and e.item_id == c.id]
            assert "".join(deltas) == c.arguments
        assert not any(o.type == "message" for o in final.output)  # the newline is no message
    else:
        assert final.output_text == text
        assert "".join(e.delta for e in parsed if e.type == "response.output_text.delta") == text
    # the streamed response is the one a non-streamed request gets (ids aside)
    body = response_body(ModelContext.create(None, None, max_model_len=512, max_n=1,
                                             model_name="m"), r, prep,
                         _outputs(text, finish)[-1], 0)
    Response.model_validate(body)
    assert [_item(Response.model_validate(body).output[i]) for i in range(len(body["output"]))
            ] == [_item(o) for o in final.output]


def _item(o: Any) -> tuple[Any, ...]:
    if o.type == "message":
        return o.type, o.status, [c.text for c in o.content]
    return o.type, o.status, o.call_id.startswith("call_"), o.name, o.arguments


def test_a_failure_mid_stream_ends_with_error_and_response_failed() -> None:
    r = req()
    prep = _prepared(r, tools=False)
    ctx = ModelContext.create(None, None, max_model_len=512, max_n=1, model_name="m")

    async def failing():  # type: ignore[no-untyped-def]
        yield 0, _outputs("Hello there", "stop")[0]
        raise RequestFailedError("the constraint cannot be completed: dead end", param="regex",
                                 kind=ErrorKind.CONSTRAINT_DEAD_END)

    async def collect() -> list[dict[str, Any]]:
        return [e async for e in response_events(ctx, r, prep, failing())]

    parsed = [EVENTS.validate_python(e) for e in asyncio.run(collect())]
    assert [e.type for e in parsed[-2:]] == ["error", "response.failed"]
    assert parsed[-2].param == "regex" and "dead end" in parsed[-2].message
    failed = parsed[-1].response
    assert failed.status == "failed" and failed.error.code == "invalid_prompt"
    assert failed.output[0].content[0].text == "Hello t"  # what was streamed before the failure
    assert failed.output[0].status == "incomplete"
