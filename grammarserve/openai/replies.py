"""Engine outputs to replies: the ``chat.completion`` / ``text_completion`` body of a finished
request (the HTTP routes and both batch paths), and the stream chunks of a streamed one."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from grammarserve.engine.request import RequestOutput
from grammarserve.openai import bodies as B
from grammarserve.openai.context import ModelContext
from grammarserve.openai.prepare import Prepared
from grammarserve.openai.protocol import ChatCompletionRequest, CompletionRequest
from grammarserve.openai.reasoning_split import ReasoningSplitter, reasoning_tokens, split
from grammarserve.openai.toolparse import ContentDelta, Event, ParsedCall

#: Receives a reply's usage once it is known (the server counts tokens in its metrics).
OnUsage = Callable[[dict[str, Any]], None]
#: ``(choice index, output)`` as they arrive, all choices interleaved.
Outputs = AsyncIterator[tuple[int, RequestOutput]]


def completion_body(ctx: ModelContext, prep: Prepared, outs: list[RequestOutput]
                    ) -> dict[str, Any]:
    """The ``chat.completion`` / ``text_completion`` reply to a finished request (``outs``: the final output of every choice, in request
    order); raises the typed error of a choice that failed in the engine."""
    for out in outs:
        prep.check_output(out)
    if prep.chat:
        choices = [_chat_choice(ctx, prep, i, o) for i, o in enumerate(outs)]
        return B.chat_completion(prep.id, ctx.model_name, choices, chat_usage(ctx, prep, outs))
    req = prep.req
    assert isinstance(req, CompletionRequest)
    n = prep.n
    choices = []
    for i, out in enumerate(outs):
        prefix = prep.echo[i // n] if prep.echo else ""
        choices.append({"index": i, "text": prefix + out.text,
                        "finish_reason": B.finish_reason(out.finish_reason, False),
                        "logprobs": _completion_logprobs(ctx, req, out, 0, 0)})
    return B.completion(prep.id, ctx.model_name, choices,
                        B.final_usage(outs, num_prompts=len(outs) // n))


def reply_parts(prep: Prepared, text: str) -> tuple[str | None, str]:
    """``(reasoning or None, content)`` of a reply's text (all content without a span)."""
    if prep.reasoning is None:
        return None, text
    reasoning, content, _ = split(prep.reasoning.format, text, opened=prep.reasoning.opened)
    return reasoning, content


def chat_usage(ctx: ModelContext, prep: Prepared, outs: list[RequestOutput]) -> dict[str, Any]:
    """The usage of a chat reply, its reasoning tokens counted."""
    usage = B.final_usage(outs)
    plan = prep.reasoning
    if plan is not None:
        usage["completion_tokens_details"]["reasoning_tokens"] = sum(
            reasoning_tokens(ctx.token_texts, o.token_ids, o.text,
                             split(plan.format, o.text, opened=plan.opened)[2]) for o in outs)
    return usage


def _with_reasoning(prep: Prepared, message: dict[str, Any], reasoning: str | None
                    ) -> dict[str, Any]:
    """``message`` with ``reasoning_content`` (DeepSeek's, SGLang's and older vLLM's name) and
    ``reasoning`` (vLLM's now), when the reply's reasoning is shown."""
    if prep.reasoning is not None and prep.reasoning.include:
        message["reasoning_content"] = message["reasoning"] = reasoning or None
    return message


def _chat_choice(ctx: ModelContext, prep: Prepared, i: int, out: RequestOutput
                 ) -> dict[str, Any]:
    reasoning, text = reply_parts(prep, out.text)
    content: str | None = text
    calls: list[ParsedCall] = []
    if prep.tools is not None:
        content, calls = prep.tools.parse(text)
    lps = None
    if getattr(prep.req, "logprobs", None):
        lps = ctx.token_texts.chat_logprobs(out.token_ids, out.logprobs, out.top_logprobs)
    choice = B.chat_choice(i, content, calls, B.finish_reason(out.finish_reason, bool(calls)),
                           lps)
    _with_reasoning(prep, choice["message"], reasoning)
    return choice


def _completion_logprobs(ctx: ModelContext, req: CompletionRequest, out: RequestOutput,
                         start: int, offset: int) -> dict[str, Any] | None:
    """Logprobs of ``out``'s tokens from ``start`` on (``offset``: their text offset)."""
    if req.logprobs is None:
        return None
    return ctx.token_texts.completion_logprobs(
        out.token_ids[start:], out.logprobs[start:], offset,
        out.top_logprobs[start:] if req.logprobs else None)


def stream_chunks(ctx: ModelContext, prep: Prepared, outputs: Outputs,
                  on_usage: OnUsage | None = None) -> AsyncIterator[dict[str, Any]]:
    """The chunks of a streamed reply (the caller adds SSE framing and ``[DONE]``)."""
    if prep.chat:
        return _chat_chunks(ctx, prep, outputs, on_usage)
    return _completion_chunks(ctx, prep, outputs, on_usage)


def _event_delta(ev: Event) -> dict[str, Any]:
    if isinstance(ev, ContentDelta):
        return {"content": ev.text}
    return {"tool_calls": [B.tool_call_delta(ev)]}


async def _chat_chunks(ctx: ModelContext, prep: Prepared, outputs: Outputs,
                       on_usage: OnUsage | None) -> AsyncIterator[dict[str, Any]]:
    req = prep.req
    assert isinstance(req, ChatCompletionRequest)
    tools = prep.tools
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    maker = B.ChunkMaker(prep.id, ctx.model_name, chat=True, include_usage=include_usage)
    n = len(prep.prompts)
    parsers = [tools.parser() if tools is not None else None for _ in range(n)]
    plan = prep.reasoning
    splitters = [ReasoningSplitter(plan.format, opened=plan.opened) if plan is not None else None
                 for _ in range(n)]
    sent = [0] * n  # tokens whose logprobs were sent
    finals: dict[int, RequestOutput] = {}
    first = {"role": "assistant", "content": None if tools is not None else "", "refusal": None}
    for i in range(n):
        yield maker.delta(i, dict(first))
    texts = ctx.token_texts
    async with aclosing(outputs) as it:  # type: ignore[type-var]
        async for i, out in it:
            parser, splitter = parsers[i], splitters[i]
            thought, delta = "", out.delta_text
            if splitter is not None:
                thought, delta = splitter.step(delta, last=out.finished)
            if parser is None:
                events: list[Event] = [ContentDelta(delta)] if delta else []
            else:
                events = parser.feed(delta) + (parser.finish() if out.finished else [])
            shown = _with_reasoning(prep, {}, thought) if thought else {}
            lps = None
            if req.logprobs and len(out.token_ids) > sent[i] and (
                    events or shown or out.finished):
                lps = texts.chat_logprobs(out.token_ids[sent[i]:], out.logprobs[sent[i]:],
                                          out.top_logprobs[sent[i]:])
                sent[i] = len(out.token_ids)
            if shown:
                yield maker.delta(i, shown, logprobs=lps)
                lps = None  # NOTE: sent with the reasoning
            for k, ev in enumerate(events):
                yield maker.delta(i, _event_delta(ev), logprobs=lps if k == 0 else None)
            if out.finished:
                finals[i] = out
                calls = bool(parser is not None and parser.calls)
                yield maker.delta(i, {}, reason=B.finish_reason(out.finish_reason, calls),
                                  logprobs=lps if not events else None)
    usage = chat_usage(ctx, prep, [finals[i] for i in range(n)])
    if on_usage is not None:
        on_usage(usage)
    if include_usage:
        yield maker.usage(usage)


async def _completion_chunks(ctx: ModelContext, prep: Prepared, outputs: Outputs,
                             on_usage: OnUsage | None) -> AsyncIterator[dict[str, Any]]:
    req = prep.req
    assert isinstance(req, CompletionRequest)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    maker = B.ChunkMaker(prep.id, ctx.model_name, chat=False, include_usage=include_usage)
    n, total = prep.n, len(prep.prompts)
    sent = [0] * total
    offsets = [0] * total
    finals: dict[int, RequestOutput] = {}
    for i, prefix in enumerate(p for p in prep.echo for _ in range(n)):
        yield maker.text(i, prefix)
    async with aclosing(outputs) as it:  # type: ignore[type-var]
        async for i, out in it:
            lps = None
            if req.logprobs is not None and (out.delta_text or out.finished):
                lps = _completion_logprobs(ctx, req, out, sent[i], offsets[i])
                sent[i] = len(out.token_ids)
            offsets[i] += len(out.delta_text)
            reason = B.finish_reason(out.finish_reason, False) if out.finished else None
            if out.delta_text or reason:
                yield maker.text(i, out.delta_text, reason=reason, logprobs=lps)
            if out.finished:
                finals[i] = out
    outs = [finals[i] for i in range(total)]
    usage = B.final_usage(outs, num_prompts=len(outs) // n)
    if on_usage is not None:
        on_usage(usage)
    if include_usage:
        yield maker.usage(usage)
