"""Reply side of the OpenAI protocol layer: streamed chunks assemble like the SDK, usage."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk
from openai_helpers import CALL, WEATHER, chat_req, engine_outputs

from grammarserve.engine.request import RequestOutput
from grammarserve.openai import ModelContext, Prepared, stream_chunks
from grammarserve.openai.bodies import final_usage
from grammarserve.openai.toolparse_array import parse_tool_calls
from grammarserve.openai.translate import (
    ToolsPlan,
)
from grammarserve.sampling_params import SamplingParams


# -- stream assembly -------------------------------------------------------------------------
async def _replay(outputs: list[tuple[int, RequestOutput]]):  # type: ignore[no-untyped-def]
    """Stands in for the engine side of one request: replays outputs in a given order."""
    for item in outputs:
        yield item


def _outputs(text: str, pieces: list[str], finish: str) -> list[RequestOutput]:
    assert "".join(pieces) == text
    return engine_outputs(pieces, finish, cached=2)


def _assemble(chunks: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    state = ChatCompletionStreamState(input_tools=tools)
    for c in chunks:
        if c["choices"]:
            state.handle_chunk(ChatCompletionChunk.model_validate(c))
    return state.get_final_completion()


@pytest.mark.parametrize("n", [1, 2])
def test_stream_assembles_like_the_sdk(n: int) -> None:
    text = "Sure.\n" + CALL + "\n" + CALL.replace("Paris", "Rome")
    rng = random.Random(n)
    per_choice = []
    for _ in range(n):
        cuts = sorted(rng.sample(range(1, len(text)), 12))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        per_choice.append(_outputs(text, pieces, "stop"))
    order = [(i, o) for k in range(13) for i in range(n) for o in per_choice[i][k:k + 1]]
    req = chat_req(tools=[WEATHER], stream=True, stream_options={"include_usage": True}, n=n)
    ctx = ModelContext.create(None, None, max_model_len=512, max_n=4, model_name="m")
    prep = Prepared("chatcmpl-test", req, [[1, 2, 3]] * n, [SamplingParams()] * n, None,
                    ToolsPlan([WEATHER], "auto", True), [], None)

    async def collect() -> list[dict[str, Any]]:
        return [c async for c in stream_chunks(ctx, prep, _replay(order))]

    chunks = asyncio.run(collect())
    finishes = [ch for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert sorted(ch["index"] for ch in finishes) == list(range(n))
    assert all(ch["finish_reason"] == "tool_calls" for ch in finishes)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 13 * n
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 2
    assert all(c["usage"] is None for c in chunks[:-1])
    roles = [ch for c in chunks for ch in c["choices"] if "role" in ch["delta"]]
    assert len(roles) == n
    final = _assemble(chunks, [WEATHER])
    expected_content, expected_calls = parse_tool_calls(text)
    for choice in final.choices:
        assert choice.message.content == expected_content
        assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [
            (c.name, c.arguments) for c in expected_calls]
        assert all(c.id.startswith("call_") for c in choice.message.tool_calls)
        assert "<tool_call>" not in (choice.message.content or "")


def test_usage_counts_each_prompt_once() -> None:
    outs = [RequestOutput("r", [1] * 10, [5] * k, "", "", True, "stop", num_cached_tokens=4)
            for k in (2, 3, 4, 5)]
    u = final_usage(outs, num_prompts=2)
    assert (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]) == (20, 14, 34)
    assert u["prompt_tokens_details"]["cached_tokens"] == 8
