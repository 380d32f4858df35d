"""Tool calls per model family end to end on the embedded model: the protocol pipeline (prepare,
engine, reply) with each family's chat template (as ``--chat-template`` gives it) and the format
detected from it, in ``required``, named and ``auto`` modes, streamed (assembled by the
``openai`` SDK) and not, through chat completions and the Responses API. Every call validates
against its tool's parameters (jsonschema), and goes back through the template: the rendered
history holds the call the way the template writes it.

One in-process engine serves every family (a family only changes the prompt's template and the
grammar); with SmolLM2's tokenizer the families' markers are plain multi-token text.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk
from test_tool_formats import PARAMS, template_form

from grammarserve.config import EngineConfig
from grammarserve.engine.engine import Engine
from grammarserve.engine.request import RequestOutput
from grammarserve.models.loader import load_tokenizer, resolve_model_folder
from grammarserve.openai.context import ModelContext
from grammarserve.openai.prepare import Prepared, prepare_chat
from grammarserve.openai.protocol import ChatCompletionRequest, ChatMessage
from grammarserve.openai.render import render_chat
from grammarserve.openai.replies import completion_body, stream_chunks
from grammarserve.openai.responses_reply import response_body, response_events
from grammarserve.openai.responses_request import ResponsesRequest, prepare_response

pytestmark = pytest.mark.model

TEMPLATES = Path(__file__).parent / "data" / "templates"
#: One template per format of the table (the built-in formats run on SmolLM2's own template).
FAMILIES = {
    "hermes": "Qwen-Qwen3-0.6B.jinja", "qwen3_coder": "Qwen3-Coder.jinja",
    "llama3_json": "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "mistral": "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "mistral_v11": "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
    "deepseek_v3": "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
    "deepseek_v31": "deepseek-ai-DeepSeek-V3.1.jinja",
    "pythonic": "grammarserve-pythonic.jinja", "harmony": "openai-gpt-oss-120b.jinja",
}
WEATHER = {"type": "function", "function": {"name": "get_weather",
                                            "description": "The weather of a city.",
                                            "parameters": PARAMS}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Rome", "Paris"]}},
                   "required": ["city"], "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Rome for 3 days?"}]
#: Enough for one call with indented arguments and the bounded whitespace after it (the model
#: writes newlines there until the grammar allows only the end); ``auto`` replies are cut earlier.
BUDGET, AUTO_BUDGET = 96, 32
#: DeepSeek's full-width markers are some 80 SmolLM2 tokens per call (one token each for DeepSeek).
BUDGETS = {"deepseek_v3": 192, "deepseek_v31": 192}
#: Families whose template has a reasoning span (Qwen3, Ministral-3 Reasoning, gpt-oss) think
#: first: a thinking budget of this many tokens closes the span, then the calls follow; the
#: reply's token budget grows by the span and its markers.
THINK, THINK_EXTRA = 8, 40


def _thinking(ctx: ModelContext, kw: dict[str, Any], budget: int) -> int:
    """The token budget of a reply, with a thinking budget set in ``kw`` for a reasoning
    family."""
    if ctx.reasoning_format is None:
        return budget
    kw["thinking_token_budget"] = THINK
    return budget + THINK + THINK_EXTRA


@pytest.fixture(scope="module")
def engine(smollm: Any) -> Engine:
    return Engine(EngineConfig(device="cpu", kv_cache_tokens=8192, max_num_reqs=8),
                  loaded=smollm)


@pytest.fixture(scope="module")
def contexts(engine: Engine) -> dict[str, ModelContext]:
    folder = resolve_model_folder("default")
    out = {}
    for fmt, name in FAMILIES.items():
        tok = load_tokenizer(folder, str(TEMPLATES / name))
        out[fmt] = ModelContext.create(tok, engine.grammar.compiler,
                                       max_model_len=engine.max_model_len, max_n=4,
                                       model_name="m")
    assert {f: c.tool_call_parser for f, c in out.items()} == {f: f for f in FAMILIES}
    return out


def _run(engine: Engine, prep: Prepared) -> list[tuple[int, RequestOutput]]:
    prep.check_constraint()
    for k, (prompt, params) in enumerate(zip(prep.prompts, prep.params, strict=True)):
        engine.add_request(f"{prep.id}-{k}", prompt, params)
    index = {f"{prep.id}-{k}": k for k in range(len(prep.prompts))}
    seen: list[tuple[int, RequestOutput]] = []
    while engine.has_unfinished():
        seen += [(index[o.request_id], o) for o in engine.step() if o.request_id in index]
    return seen


async def _replay(items: list[tuple[int, RequestOutput]]
                  ) -> AsyncIterator[tuple[int, RequestOutput]]:
    for item in items:
        yield item


def _chat(engine: Engine, ctx: ModelContext, stream: bool, budget: int = BUDGET, **kw: Any
          ) -> tuple[str | None, list[tuple[str, str]], str]:
    """``(content, [(name, arguments)], finish_reason)`` of one chat completion."""
    budget = _thinking(ctx, kw, budget)
    req = ChatCompletionRequest.model_validate({
        "model": "m", "messages": ASK, "tools": TOOLS, "max_tokens": budget, "temperature": 0,
        "stream": stream, **kw})
    prep = prepare_chat(ctx, req)
    items = _run(engine, prep)
    if not stream:
        body = completion_body(ctx, prep, [items[-1][1]])
        msg, finish = body["choices"][0]["message"], body["choices"][0]["finish_reason"]
        return msg["content"], [(c["function"]["name"], c["function"]["arguments"])
                                for c in msg.get("tool_calls") or []], finish

    async def collect() -> list[dict[str, Any]]:
        return [c async for c in stream_chunks(ctx, prep, _replay(items))]

    state = ChatCompletionStreamState(input_tools=TOOLS)  # type: ignore[arg-type]
    for chunk in asyncio.run(collect()):
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    choice = state.current_completion_snapshot.choices[0]  # NOTE: also for "length"
    return choice.message.content, [(c.function.name, c.function.arguments)
                                    for c in choice.message.tool_calls or []], \
        str(choice.finish_reason)


def _valid(calls: list[tuple[str, str]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for name, arguments in calls:
        args = json.loads(arguments)
        jsonschema.validate(args, SCHEMAS[name])
        out.append((name, args))
    return out


def _round_trip(ctx: ModelContext, fmt: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
    """The calls put back in the history render as the template writes them."""
    history = [ChatMessage.model_validate(m) for m in [*ASK, {
        "role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": n, "arguments": json.dumps(a)}}
            for i, (n, a) in enumerate(calls)]}] + [
        {"role": "tool", "tool_call_id": f"call_{i}", "content": "sunny"}
        for i in range(len(calls))]]
    rendered = render_chat(ctx.tokenizer, history, tools=TOOLS, tool_format=fmt)
    for name, args in calls:
        template_form(fmt, name, args, rendered)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("fmt", list(FAMILIES))
def test_required_and_named_calls(engine: Engine, contexts: dict[str, ModelContext], fmt: str,
                                  stream: bool) -> None:
    ctx = contexts[fmt]
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        content, calls, finish = _chat(engine, ctx, stream, BUDGETS.get(fmt, BUDGET),
                                       tool_choice=choice, parallel_tool_calls=False)
        assert finish == "tool_calls", (fmt, choice, content, calls)
        assert not content and len(calls) == 1
        valid = _valid(calls)
        if isinstance(choice, dict):
            assert valid[0][0] == "get_time"
        _round_trip(ctx, fmt, valid)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("fmt", list(FAMILIES))
def test_auto_is_text_or_valid_calls(engine: Engine, contexts: dict[str, ModelContext],
                                     fmt: str, stream: bool) -> None:
    content, calls, finish = _chat(engine, contexts[fmt], stream, AUTO_BUDGET,
                                   tool_choice="auto")
    if calls:
        assert finish in ("tool_calls", "length")
        complete = calls if finish == "tool_calls" else calls[:-1]  # the last one may be cut
        _round_trip(contexts[fmt], fmt, _valid(complete))
    else:
        assert finish in ("stop", "length"), (content, calls, finish)  # text, maybe empty
    assert "get_weather(" not in (content or "") and "<function=" not in (content or "")


@pytest.mark.parametrize("fmt", ["qwen3_coder", "pythonic", "harmony"])
def test_responses_function_calls(engine: Engine, contexts: dict[str, ModelContext],
                                  fmt: str) -> None:
    ctx = contexts[fmt]
    extra: dict[str, Any] = {}
    budget = _thinking(ctx, extra, BUDGETS.get(fmt, BUDGET))
    body = {"model": "m", "input": ASK[0]["content"], "max_output_tokens": budget,
            "temperature": 0, "tool_choice": "required", "parallel_tool_calls": False,
            "tools": [{"type": "function", **t["function"]} for t in TOOLS], **extra}
    req = ResponsesRequest.model_validate(body)
    prep = prepare_response(ctx, req)
    items = _run(engine, prep)
    whole = response_body(ctx, req, prep, items[-1][1], 0)
    kinds = [o["type"] for o in whole["output"]]
    assert kinds == (["reasoning"] if ctx.reasoning_format else []) + ["function_call"], kinds
    item = whole["output"][-1]
    assert item["type"] == "function_call" and item["status"] == "completed"
    _valid([(item["name"], item["arguments"])])

    async def collect() -> list[dict[str, Any]]:
        return [e async for e in response_events(ctx, req, prep, _replay(items))]

    events = asyncio.run(collect())
    added = [e for e in events if e["type"] == "response.output_item.added"
             and e["item"]["type"] == "function_call"]
    deltas = "".join(e["delta"] for e in events
                     if e["type"] == "response.function_call_arguments.delta")
    assert [e["item"]["name"] for e in added] == [item["name"]]
    assert deltas == item["arguments"]
