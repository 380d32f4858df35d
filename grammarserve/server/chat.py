"""``POST /v1/chat/completions``: plain, constrained and tool-calling chat, streamed or not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from grammarserve.engine.request import RequestOutput
from grammarserve.errors import GrammarError
from grammarserve.server import responses as R
from grammarserve.server.generate import Generation, Receive
from grammarserve.server.protocol import ChatCompletionRequest
from grammarserve.server.render import content_text, render_chat
from grammarserve.server.state import ServerState
from grammarserve.server.toolparse import (
    ContentDelta,
    Event,
    ParsedCall,
    ToolCallArgs,
    ToolCallStart,
)
from grammarserve.server.toolparse_array import make_parser, parse_calls
from grammarserve.server.translate import (
    ConstraintPlan,
    ToolsPlan,
    check_chat_logprobs,
    check_common,
    check_json_mode,
    constraint_plan,
    grammar_error,
    max_new_tokens,
    sampling_params,
    tools_plan,
)


async def validate_constraint(state: ServerState, plan: ConstraintPlan | None) -> None:
    """Compile the constraint in the server (cached) so a bad one is a 400 before queueing."""
    if plan is None or state.compiler is None:
        return
    kind, args, kwargs = plan.constraint.compile_args()
    try:
        await asyncio.wrap_future(state.compiler.compile_async(kind, *args, **kwargs))
    except GrammarError as e:
        raise grammar_error(e, plan) from None


def _prompt(state: ServerState, req: ChatCompletionRequest, tools: ToolsPlan | None
            ) -> list[int]:
    text = render_chat(state.tokenizer, req.messages,
                       tools=tools.tools if tools else None,
                       tool_choice=tools.choice if tools else "auto",
                       parallel=tools.parallel if tools else True,
                       tool_format=tools.format if tools else "hermes")
    return list(state.tokenizer.encode(text, add_special_tokens=False))


async def prepare(state: ServerState, req: ChatCompletionRequest
                  ) -> tuple[Generation, ToolsPlan | None]:
    """Validate and translate ``req``; returns its (not yet started) engine requests."""
    state.require_engine()
    check_common(req, max_n=state.config.max_n)
    check_chat_logprobs(req)
    tools = tools_plan(req, state.config.engine.tool_call_format)
    plan = constraint_plan(req, tools)
    prompt = await asyncio.to_thread(_prompt, state, req, tools)
    check_json_mode(req, [content_text(m.content, f"messages[{i}]")
                          for i, m in enumerate(req.messages)])
    requested = req.max_completion_tokens or req.max_tokens
    max_tokens = max_new_tokens(requested, len(prompt), state.max_model_len)
    await validate_constraint(state, plan)
    n = req.n or 1
    params = sampling_params(req, max_tokens=max_tokens, plan=plan, n=n,
                             vocab_size=len(state.tokenizer))
    gen = Generation(state, R.new_id("chatcmpl"), [prompt] * n, params,
                     namespace=req.cache_namespace or "",
                     constraint_param=plan.param if plan else None)
    return gen, tools


def _choice(state: ServerState, i: int, out: RequestOutput, tools: ToolsPlan | None,
            logprobs: bool) -> dict[str, Any]:
    content: str | None = out.text
    calls: list[ParsedCall] = []
    if tools is not None:
        content, calls = parse_calls(out.text, tools.format)
    lps = None
    if logprobs and state.token_texts is not None:
        lps = state.token_texts.chat_logprobs(out.token_ids, out.logprobs, out.top_logprobs)
    return R.chat_choice(i, content, calls, R.finish_reason(out.finish_reason, bool(calls)), lps)


async def complete(state: ServerState, req: ChatCompletionRequest, gen: Generation,
                   tools: ToolsPlan | None, receive: Receive) -> dict[str, Any] | None:
    """The non-streamed reply (None if the client disconnected)."""
    outs = await gen.results(receive)
    if outs is None:
        return None
    usage = R.final_usage(outs)
    state.metrics.observe_usage(usage)
    choices = [_choice(state, i, o, tools, bool(req.logprobs)) for i, o in enumerate(outs)]
    return R.chat_completion(gen.base_id, state.model_name, choices, usage)


def _event_delta(ev: Event) -> dict[str, Any]:
    if isinstance(ev, ContentDelta):
        return {"content": ev.text}
    if isinstance(ev, ToolCallStart):
        return {"tool_calls": [{"index": ev.index, "id": ev.id, "type": "function",
                                "function": {"name": ev.name, "arguments": ""}}]}
    assert isinstance(ev, ToolCallArgs)
    return {"tool_calls": [{"index": ev.index, "function": {"arguments": ev.text}}]}


async def stream(state: ServerState, req: ChatCompletionRequest, gen: Generation,
                 tools: ToolsPlan | None) -> AsyncIterator[dict[str, Any]]:
    """The chunks of a streamed reply (the caller adds SSE framing and ``[DONE]``)."""
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    maker = R.ChunkMaker(gen.base_id, state.model_name, chat=True,
                         include_usage=include_usage)
    n = len(gen.ids)
    parsers = [make_parser(tools.format) if tools is not None else None for _ in range(n)]
    sent = [0] * n  # tokens whose logprobs were sent
    finals: dict[int, RequestOutput] = {}
    first = {"role": "assistant", "content": None if tools is not None else "", "refusal": None}
    for i in range(n):
        yield maker.delta(i, dict(first))
    async with aclosing(gen.stream()) as outputs:
        async for i, out in outputs:
            parser = parsers[i]
            if parser is None:
                events: list[Event] = [ContentDelta(out.delta_text)] if out.delta_text else []
            else:
                events = parser.feed(out.delta_text) + (parser.finish() if out.finished else [])
            lps = None
            texts = state.token_texts
            if req.logprobs and texts and len(out.token_ids) > sent[i] and (events or out.finished):
                lps = texts.chat_logprobs(out.token_ids[sent[i]:], out.logprobs[sent[i]:],
                                          out.top_logprobs[sent[i]:])
                sent[i] = len(out.token_ids)
            for k, ev in enumerate(events):
                yield maker.delta(i, _event_delta(ev), logprobs=lps if k == 0 else None)
            if out.finished:
                finals[i] = out
                calls = bool(parser is not None and parser.calls)
                yield maker.delta(i, {}, reason=R.finish_reason(out.finish_reason, calls),
                                  logprobs=lps if not events else None)
    usage = R.final_usage([finals[i] for i in range(n)])
    state.metrics.observe_usage(usage)
    if include_usage:
        yield maker.usage(usage)
