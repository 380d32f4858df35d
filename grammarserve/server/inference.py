"""The generating routes: ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/responses``.

Each route is HTTP only: it prepares the request with the protocol layer
(:mod:`grammarserve.openai`), runs its engine requests, and answers with JSON or an SSE stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from grammarserve.errors import ErrorKind
from grammarserve.openai.bodies import final_usage
from grammarserve.openai.errors import kind_response
from grammarserve.openai.generation import Generation
from grammarserve.openai.prepare import Prepared, prepare_chat, prepare_completion
from grammarserve.openai.protocol import ChatCompletionRequest, CompletionRequest
from grammarserve.openai.replies import completion_body, stream_chunks
from grammarserve.openai.responses_reply import response_body, response_events
from grammarserve.openai.responses_request import ResponsesRequest, prepare_response
from grammarserve.openai.tenancy import TenantClient
from grammarserve.server.auth import tenant_of
from grammarserve.server.sse import sse
from grammarserve.server.state import ServerState


def overloaded() -> JSONResponse:
    """503 with ``Retry-After`` when too many engine requests are in flight."""
    status, body = kind_response(ErrorKind.OVERLOADED, "the server is overloaded; retry later")
    return JSONResponse(body, status_code=status, headers={"Retry-After": "1"})


def router(state: ServerState) -> APIRouter:
    """The generating routes over ``state``'s engine."""
    r = APIRouter()

    async def run(gen: Generation, body: Callable[[], Awaitable[dict[str, Any] | None]] | None,
                  events: Callable[[], AsyncIterator[dict[str, Any]]] | None, *,
                  typed: bool = False) -> Response:
        """Start the engine requests and answer with JSON or an SSE stream."""
        n = len(gen.ids)
        if not state.try_reserve(n):
            return overloaded()
        try:
            gen.start()
            if events is not None:
                # NOTE: the status line waits for every choice's first output, so what fails
                # before its first token is the same 400 streamed or not (issue 20)
                await gen.prime()
        except BaseException:
            state.release(n)
            raise
        if events is not None:
            return StreamingResponse(sse(events(), lambda: state.release(n), typed=typed),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        assert body is not None
        try:
            result = await body()
        finally:
            state.release(n)
        if result is None:  # the client went away; nobody reads this
            return Response(status_code=499)
        return JSONResponse(result)

    async def prepare(fn: Callable[..., Prepared], req: Any) -> Prepared:
        ctx = state.require_context()
        prep = await asyncio.to_thread(fn, ctx, req)
        # NOTE: what the front end refuses is a 400 before anything is queued; what the
        # engine's compile refuses, the same 400 before any output (see Prepared.check_output)
        prep.check_constraint()
        return prep

    def generation(prep: Prepared, request: Request) -> Generation:
        """The engine requests of ``prep``, in the caller's tenant's cache namespace."""
        return Generation(TenantClient(state, tenant_of(request)), prep, timings=state.timings)

    async def answer(prep: Prepared, stream: bool, request: Request) -> Response:
        ctx = state.require_context()
        gen = generation(prep, request)
        if stream:
            return await run(gen, None, lambda: stream_chunks(ctx, prep, gen.stream(),
                                                              state.metrics.observe_usage))

        async def body() -> dict[str, Any] | None:
            outs = await gen.results(request.receive)
            if outs is None:
                return None
            reply = completion_body(ctx, prep, outs)
            state.metrics.observe_usage(reply["usage"])
            return reply

        return await run(gen, body, None)

    @r.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
        return await answer(await prepare(prepare_chat, req), bool(req.stream), request)

    @r.post("/v1/completions")
    async def text_completions(req: CompletionRequest, request: Request) -> Response:
        return await answer(await prepare(prepare_completion, req), bool(req.stream), request)

    @r.post("/v1/responses")
    async def responses(req: ResponsesRequest, request: Request) -> Response:
        prep = await prepare(prepare_response, req)
        ctx = state.require_context()
        gen = generation(prep, request)
        if req.stream:
            return await run(gen, None, lambda: response_events(
                ctx, req, prep, gen.stream(), state.metrics.observe_usage), typed=True)
        created = int(time.time())

        async def body() -> dict[str, Any] | None:
            outs = await gen.results(request.receive)
            if outs is None:
                return None
            state.metrics.observe_usage(final_usage(outs))
            return response_body(ctx, req, prep, outs[0], created)

        return await run(gen, body, None)

    return r

