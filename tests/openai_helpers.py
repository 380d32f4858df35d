"""Test helpers shared by the OpenAI protocol layer's tests: two function tools, a chat request
builder and one Hermes tool call."""

from __future__ import annotations

from typing import Any

from grammarserve.openai.protocol import ChatCompletionRequest

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}


def chat_req(**kw: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body.update(kw)
    return ChatCompletionRequest.model_validate(body)


CALL = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "x": [1, "}"]}}\n'
        '</tool_call>')
