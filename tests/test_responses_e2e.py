"""``POST /v1/responses`` end to end: the official ``openai`` SDK against the real server on the
embedded model (``responses.parse`` with a Pydantic model, ``responses.create`` with function
tools, streamed and not, a multi-turn tool conversation, and the stateless refusal)."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from pydantic import BaseModel

pytestmark = pytest.mark.model

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "strict": True, "parameters": {
               "type": "object", "properties": {"city": {"type": "string"}},
               "required": ["city"], "additionalProperties": False}}
ASK = "What is the weather in Paris?"


class City(BaseModel):
    name: str
    country: str


@pytest.fixture(scope="module")
def client(e2e_server: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=e2e_server["url"] + "/v1", api_key="none", max_retries=0)


def test_parse_returns_the_pydantic_model(client: openai.OpenAI) -> None:
    reply = client.responses.parse(model="m", instructions="Answer in JSON.",
                                   input="Name a city in France and its country.",
                                   text_format=City, max_output_tokens=60, temperature=0)
    assert reply.status == "completed", reply
    assert isinstance(reply.output_parsed, City) and reply.output_parsed.name
    assert reply.id.startswith("resp_") and reply.object == "response"
    assert reply.usage is not None and reply.usage.input_tokens > 0
    assert reply.usage.output_tokens > 0 and reply.usage.total_tokens == (
        reply.usage.input_tokens + reply.usage.output_tokens)
    assert reply.text is not None and reply.text.format is not None
    assert reply.text.format.type == "json_schema"


def test_streamed_function_call_has_valid_json_arguments(client: openai.OpenAI) -> None:
    stream = client.responses.create(model="m", input=ASK, tools=[WEATHER],  # type: ignore[list-item]
                                     tool_choice="required", stream=True,
                                     max_output_tokens=80, temperature=0)
    events = list(stream)
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"], types
    assert types[-1] == "response.completed", types
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done, types
    args = json.loads(done[0].arguments)
    assert set(args) == {"city"} and isinstance(args["city"], str)
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"
              and e.item_id == done[0].item_id]
    assert "".join(deltas) == done[0].arguments
    final = events[-1].response  # type: ignore[union-attr]
    calls = [o for o in final.output if o.type == "function_call"]
    assert calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    assert json.loads(calls[0].arguments) == args
    added = [e for e in events if e.type == "response.output_item.added"]
    assert added[0].item.type == "function_call"


def test_stream_helper_accumulates_text(client: openai.OpenAI) -> None:
    with client.responses.stream(model="m", input="Say hello in one short sentence.",
                                 max_output_tokens=100, temperature=0, store=False) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()  # needs response.completed (not cut by the limit)
    assert deltas and "".join(deltas) == final.output_text
    assert final.status == "completed" and final.store is False
    cut = client.responses.create(model="m", input="Count from 1 to 100.", max_output_tokens=5,
                                  temperature=0)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"


def test_create_with_tools_then_answer_the_result(client: openai.OpenAI) -> None:
    first = client.responses.create(model="m", input=ASK, tools=[WEATHER],  # type: ignore[list-item]
                                    tool_choice={"type": "function", "name": "get_weather"},
                                    max_output_tokens=80, temperature=0)
    calls = [o for o in first.output if o.type == "function_call"]
    assert first.status == "completed" and len(calls) == 1, first.output
    assert calls[0].name == "get_weather" and "city" in json.loads(calls[0].arguments)
    history: list[Any] = [{"role": "user", "content": ASK},
                          {"type": "function_call", "call_id": calls[0].call_id,
                           "name": calls[0].name, "arguments": calls[0].arguments},
                          {"type": "function_call_output", "call_id": calls[0].call_id,
                           "output": "sunny, 21 C"}]
    second = client.responses.create(model="m", input=history, tools=[WEATHER],  # type: ignore[list-item]
                                     tool_choice="none", max_output_tokens=20, temperature=0)
    assert second.output[0].type == "message" and second.output_text


def test_previous_response_id_is_a_400_naming_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="m", input="hi", previous_response_id="resp_123")
    assert err.value.param == "previous_response_id"
    assert "stateless" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="m", input="hi", text={"format": {  # type: ignore[typeddict-item]
            "type": "json_schema", "name": "bad", "schema": {"type": "strin"}}})
    assert err.value.param == "text.format" and "Invalid schema" in err.value.message
