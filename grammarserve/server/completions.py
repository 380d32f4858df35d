"""``POST /v1/completions`` (legacy text completions, with the same constraint extensions)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from grammarserve.engine.request import RequestOutput
from grammarserve.errors import InvalidRequestError
from grammarserve.server import responses as R
from grammarserve.server.chat import validate_constraint
from grammarserve.server.generate import Generation, Receive
from grammarserve.server.protocol import CompletionRequest
from grammarserve.server.state import ServerState
from grammarserve.server.translate import (
    check_common,
    check_completion,
    completion_prompts,
    constraint_plan,
    max_new_tokens,
    sampling_params,
)


async def prepare(state: ServerState, req: CompletionRequest) -> tuple[Generation, list[str]]:
    """Validate and translate ``req``: ``n`` engine requests per prompt, in prompt order.
    Also returns the prompt texts (for ``echo``)."""
    state.require_engine()
    check_common(req, max_n=state.config.max_n)
    check_completion(req)
    if req.echo and req.logprobs is not None:
        raise InvalidRequestError("echo together with logprobs is not supported", param="echo")
    plan = constraint_plan(req, None)
    prompts = await asyncio.to_thread(completion_prompts, req, state.tokenizer)
    n = req.n or 1
    all_prompts: list[list[int]] = []
    params = []
    for ids in prompts:
        max_tokens = max_new_tokens(req.max_tokens, len(ids), state.max_model_len, "prompt")
        params += sampling_params(req, max_tokens=max_tokens, plan=plan, n=n,
                                  vocab_size=len(state.tokenizer))
        all_prompts += [ids] * n
    await validate_constraint(state, plan)
    texts = [state.tokenizer.decode(ids) for ids in prompts] if req.echo else []
    gen = Generation(state, R.new_id("cmpl"), all_prompts, params,
                     namespace=req.cache_namespace or "",
                     constraint_param=plan.param if plan else None)
    return gen, texts


def _logprobs(state: ServerState, req: CompletionRequest, out: RequestOutput, start: int,
              offset: int) -> dict[str, Any] | None:
    """Logprobs of ``out``'s tokens from ``start`` on (``offset``: their text offset)."""
    if req.logprobs is None or state.token_texts is None:
        return None
    return state.token_texts.completion_logprobs(
        out.token_ids[start:], out.logprobs[start:], offset,
        out.top_logprobs[start:] if req.logprobs else None)


async def complete(state: ServerState, req: CompletionRequest, gen: Generation,
                   echo: list[str], receive: Receive) -> dict[str, Any] | None:
    outs = await gen.results(receive)
    if outs is None:
        return None
    n = req.n or 1
    choices = []
    for i, out in enumerate(outs):
        prefix = echo[i // n] if echo else ""
        choices.append({"index": i, "text": prefix + out.text,
                        "finish_reason": R.finish_reason(out.finish_reason, False),
                        "logprobs": _logprobs(state, req, out, 0, 0)})
    usage = R.final_usage(outs, num_prompts=len(outs) // n)
    state.metrics.observe_usage(usage)
    return R.completion(gen.base_id, state.model_name, choices, usage)


async def stream(state: ServerState, req: CompletionRequest, gen: Generation,
                 echo: list[str]) -> AsyncIterator[dict[str, Any]]:
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    maker = R.ChunkMaker(gen.base_id, state.model_name, chat=False, include_usage=include_usage)
    n = req.n or 1
    sent = [0] * len(gen.ids)
    offsets = [0] * len(gen.ids)
    finals: dict[int, RequestOutput] = {}
    for i, prefix in enumerate(p for p in echo for _ in range(n)):
        yield maker.text(i, prefix)
    async with aclosing(gen.stream()) as outputs:
        async for i, out in outputs:
            lps = None
            if req.logprobs is not None and (out.delta_text or out.finished):
                lps = _logprobs(state, req, out, sent[i], offsets[i])
                sent[i] = len(out.token_ids)
            offsets[i] += len(out.delta_text)
            reason = R.finish_reason(out.finish_reason, False) if out.finished else None
            if out.delta_text or reason:
                yield maker.text(i, out.delta_text, reason=reason, logprobs=lps)
            if out.finished:
                finals[i] = out
    outs = [finals[i] for i in range(len(gen.ids))]
    usage = R.final_usage(outs, num_prompts=len(outs) // n)
    state.metrics.observe_usage(usage)
    if include_usage:
        yield maker.usage(usage)
