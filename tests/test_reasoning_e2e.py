"""Reasoning end to end: the real server on the embedded model with Qwen3's chat template
(``--chat-template``), through the ``openai`` SDK. SmolLM2 never writes ``</think>`` by
itself, so the thinking budget is what closes its span: the reply thinks (``reasoning_content``
at most the budget's tokens), stops at the budget, then returns JSON valid against the
``response_format``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel
from server_helpers import running_server

pytestmark = pytest.mark.model

TEMPLATE = Path(__file__).parent / "data" / "templates" / "Qwen-Qwen3-0.6B.jinja"
BUDGET = 24


class City(BaseModel):
    name: str
    population: int


SCHEMA = {**City.model_json_schema(), "additionalProperties": False}
ASK = [{"role": "user", "content": "Invent a city. Answer in JSON with name and population."}]
FORMAT = {"type": "json_schema", "json_schema": {"name": "City", "schema": SCHEMA,
                                                 "strict": True}}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Any:
    log = tmp_path_factory.mktemp("reasoning") / "server.log"
    with running_server(log, "--kv-cache-tokens", "8192", "--chat-template",
                        str(TEMPLATE)) as server:
        yield openai.OpenAI(base_url=server["url"] + "/v1", api_key="x", max_retries=0,
                            timeout=300)


def _tokens(client: Any, text: str) -> int:
    """Tokens of ``text`` in the served model's tokenizer (``/tokenize``)."""
    import urllib.request

    base = str(client.base_url).removesuffix("/v1/")
    body = json.dumps({"prompt": text}).encode()
    request = urllib.request.Request(base + "/tokenize", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as reply:
        return int(json.load(reply)["count"])


def test_thinks_within_the_budget_then_answers_the_schema(client: Any) -> None:
    r = client.chat.completions.create(model="m", messages=ASK, temperature=0, max_tokens=120,
                                       response_format=FORMAT,
                                       extra_body={"thinking_token_budget": BUDGET})
    choice = r.choices[0]
    message = choice.message.model_dump()
    assert choice.finish_reason == "stop"
    assert message["reasoning_content"] and message["reasoning"] == message["reasoning_content"]
    assert _tokens(client, message["reasoning_content"]) <= BUDGET + 2  # NOTE: re-tokenized
    assert "<think>" not in choice.message.content and "</think>" not in choice.message.content
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    reasoning_tokens = r.usage.completion_tokens_details.reasoning_tokens
    assert BUDGET <= reasoning_tokens < r.usage.completion_tokens


def test_sdk_parse_sees_only_the_answer(client: Any) -> None:
    r = client.chat.completions.parse(model="m", messages=ASK, temperature=0, max_tokens=120,
                                      response_format=City,
                                      extra_body={"reasoning_effort": "minimal",
                                                  "thinking_budget": 16})
    assert isinstance(r.choices[0].message.parsed, City)
    assert r.choices[0].message.reasoning_content  # type: ignore[attr-defined]


def test_streamed_reasoning_then_content(client: Any) -> None:
    stream = client.chat.completions.create(
        model="m", messages=ASK, temperature=0, max_tokens=120, response_format=FORMAT,
        stream=True, stream_options={"include_usage": True},
        extra_body={"thinking_token_budget": BUDGET})
    reasoning, content, order, usage = "", "", [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            delta = c.delta.model_dump()
            if delta.get("reasoning_content"):
                reasoning += delta["reasoning_content"]
                order.append("r")
            if delta.get("content"):
                content += delta["content"]
                order.append("c")
    whole = client.chat.completions.create(
        model="m", messages=ASK, temperature=0, max_tokens=120, response_format=FORMAT,
        extra_body={"thinking_token_budget": BUDGET}).choices[0].message
    assert (reasoning, content) == (whole.model_dump()["reasoning_content"], whole.content)
    assert order == sorted(order, key=lambda x: x != "r")  # all reasoning, then the content
    assert usage is not None and usage.completion_tokens_details.reasoning_tokens >= BUDGET


def test_enable_thinking_false_has_no_reasoning(client: Any) -> None:
    r = client.chat.completions.create(
        model="m", messages=ASK, temperature=0, max_tokens=80, response_format=FORMAT,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    message = r.choices[0].message
    assert message.model_dump().get("reasoning_content") is None
    jsonschema.validate(json.loads(message.content), SCHEMA)
    assert r.usage.completion_tokens_details.reasoning_tokens == 0


def test_responses_api_reasoning_item(client: Any) -> None:
    r = client.responses.create(
        model="m", input="Invent a city. Answer in JSON with name and population.",
        temperature=0, max_output_tokens=120, reasoning={"effort": "low"},
        text={"format": {"type": "json_schema", "name": "City", "schema": SCHEMA,
                         "strict": True}},
        extra_body={"thinking_token_budget": 16})
    kinds = [item.type for item in r.output]
    assert kinds == ["reasoning", "message"]
    assert r.output[0].content[0].type == "reasoning_text" and r.output[0].content[0].text
    jsonschema.validate(json.loads(r.output_text), SCHEMA)
    assert r.usage.output_tokens_details.reasoning_tokens >= 16
    with client.responses.stream(
            model="m", input="Invent a city. Answer in JSON with name and population.",
            temperature=0, max_output_tokens=120, reasoning={"effort": "low"},
            text={"format": {"type": "json_schema", "name": "City", "schema": SCHEMA,
                             "strict": True}},
            extra_body={"thinking_token_budget": 16}) as stream:
        types = [ev.type for ev in stream]
        final = stream.get_final_response()
    assert "response.reasoning_text.delta" in types and "response.reasoning_text.done" in types
    assert types.index("response.reasoning_text.done") < types.index(
        "response.output_text.delta")
    assert [item.type for item in final.output] == kinds
    assert final.output[0].content[0].text == r.output[0].content[0].text


def test_a_bad_budget_names_its_parameter(client: Any) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=ASK, max_tokens=8,
                                       extra_body={"thinking_token_budget": -1})
    assert e.value.body["param"] == "thinking_token_budget"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=ASK, max_tokens=8,
                                       reasoning_effort="none",
                                       extra_body={"thinking_budget": 5})
    assert e.value.body["param"] == "thinking_budget"


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"], "additionalProperties": False}}}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_thinks_then_calls_a_tool_in_the_templates_format(client: Any, stream: bool) -> None:
    """Tools alike: the span, closed by the budget, then a constrained call in the family's
    format (Qwen3: Hermes blocks, detected from the template); the call parsed from the answer
    only, the thoughts in reasoning_content."""
    kw: dict[str, Any] = {"model": "m", "temperature": 0, "max_tokens": 120, "tools": [WEATHER],
                              "tool_choice": "required", "parallel_tool_calls": False,
                              "messages": [{"role": "user", "content": "Weather in Rome?"}],
                              "extra_body": {"thinking_token_budget": BUDGET}}
    if stream:
        with client.chat.completions.stream(**kw) as s:
            completion = s.get_final_completion()
    else:
        completion = client.chat.completions.create(**kw)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    thoughts = choice.message.model_dump().get("reasoning_content")
    assert thoughts and "<tool_call>" not in thoughts and "</think>" not in thoughts
    assert not choice.message.content
