"""Test helpers shared by the OpenAI protocol layer's tests: two function tools, a chat request
builder, one Hermes tool call, and the engine outputs of a streamed reply."""

from __future__ import annotations

from typing import Any

from grammarserve.engine.request import RequestOutput
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


def pieces_of(text: str, cut: int) -> list[str]:
    """``text`` in pieces of ``cut`` characters (one empty piece for no text)."""
    return [text[i:i + cut] for i in range(0, len(text), cut)] or [""]


def engine_outputs(pieces: list[str], finish: str, cached: int = 1) -> list[RequestOutput]:
    """What the engine yields for one request whose text arrives in ``pieces``: one output
    per piece (its delta, the text so far), the last finished with ``finish``."""
    outs, acc = [], ""
    for k, piece in enumerate(pieces):
        acc += piece
        last = k == len(pieces) - 1
        outs.append(RequestOutput("r", [1, 2, 3], list(range(k + 1)), acc, piece, last,
                                  finish if last else None, num_cached_tokens=cached))
    return outs
