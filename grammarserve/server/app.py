"""The FastAPI application: routes, the OpenAI error envelope, SSE framing, metrics."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from grammarserve.errors import (
    EngineDeadError,
    GrammarError,
    GrammarserveError,
    InvalidRequestError,
)
from grammarserve.server import batches, chat, completions
from grammarserve.server.config import ServerConfig
from grammarserve.server.generate import Generation
from grammarserve.server.metrics import ServerMetrics
from grammarserve.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from grammarserve.server.render import render_chat
from grammarserve.server.responses import error_body
from grammarserve.server.state import ServerState
from grammarserve.server.translate import dumps

log = logging.getLogger(__name__)


def _error(status: int, message: str, type_: str, param: str | None = None,
           code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_=type_, param=param, code=code),
                        status_code=status)


def _exception_response(e: BaseException) -> JSONResponse:
    """Map an exception to the OpenAI error envelope (400 for client mistakes)."""
    if isinstance(e, InvalidRequestError):
        return _error(400, str(e), "invalid_request_error", e.param)
    if isinstance(e, GrammarError):
        return _error(400, str(e), "invalid_request_error", None)
    if isinstance(e, EngineDeadError):
        return _error(503, str(e), "unavailable_error", None, "engine_unavailable")
    if isinstance(e, GrammarserveError):
        return _error(500, str(e), "server_error")
    log.exception("unhandled error", exc_info=e)
    return _error(500, f"internal server error: {type(e).__name__}", "server_error")


def _validation_response(e: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 as an OpenAI 400 naming the param (``messages[0].role``)."""
    errors = list(e.errors())
    if any(err.get("type") == "json_invalid" for err in errors):
        return _error(400, "the request body is not valid JSON", "invalid_request_error")
    locs = [tuple(x for x in err.get("loc", ()) if x != "body") for err in errors]
    common = tuple(os.path.commonprefix(locs)) if len(locs) > 1 else (locs[0] if locs else ())
    param = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in common).lstrip(".")
    msgs = list(dict.fromkeys(str(err.get("msg", "invalid value")) for err in errors))
    detail = msgs[0] if len(msgs) == 1 else "; or ".join(msgs[:4])
    return _error(400, f"{param or 'body'}: {detail}", "invalid_request_error", param or None)


def _overloaded() -> JSONResponse:
    resp = _error(503, "the server is overloaded; retry later", "unavailable_error", None,
                  "server_overloaded")
    resp.headers["Retry-After"] = "1"
    return resp


def create_app(config: ServerConfig, *, on_failure: Callable[[str], None] | None = None
               ) -> FastAPI:
    """Build the app; the engine starts loading when the app starts (``/health`` answers 503
    until it is ready)."""
    state = ServerState(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.start(on_failure)
        yield
        state.shutdown()

    app = FastAPI(title="grammarserve", version="0.1.0", lifespan=lifespan)
    app.state.gs = state
    app.add_middleware(_CountRequests, metrics=state.metrics)
    app.include_router(batches.router(state))  # /v1/files, /v1/batches and the batch worker

    @app.exception_handler(RequestValidationError)
    async def _on_validation(_: Request, e: RequestValidationError) -> JSONResponse:
        return _validation_response(e)

    @app.exception_handler(HTTPException)
    async def _on_http(_: Request, e: HTTPException) -> JSONResponse:
        type_ = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return _error(e.status_code, str(e.detail), type_)

    @app.exception_handler(Exception)
    async def _on_error(_: Request, e: Exception) -> JSONResponse:
        return _exception_response(e)

    @app.exception_handler(GrammarserveError)
    async def _on_grammarserve_error(_: Request, e: GrammarserveError) -> JSONResponse:
        return _exception_response(e)

    async def run(prepared: Generation, n: int,
                  body: Callable[[], Awaitable[dict[str, Any] | None]] | None,
                  events: Callable[[], AsyncIterator[dict[str, Any]]] | None) -> Response:
        """Start the engine requests and answer with JSON or an SSE stream."""
        if not state.try_reserve(n):
            return _overloaded()
        try:
            prepared.start()
        except BaseException:
            state.release(n)
            raise
        if events is not None:
            return StreamingResponse(_sse(events(), lambda: state.release(n)),
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

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
        gen, tools = await chat.prepare(state, req)
        if req.stream:
            return await run(gen, len(gen.ids), None, lambda: chat.stream(state, req, gen, tools))
        return await run(gen, len(gen.ids),
                         lambda: chat.complete(state, req, gen, tools, request.receive), None)

    @app.post("/v1/completions")
    async def text_completions(req: CompletionRequest, request: Request) -> Response:
        gen, echo = await completions.prepare(state, req)
        if req.stream:
            return await run(gen, len(gen.ids), None,
                             lambda: completions.stream(state, req, gen, echo))
        return await run(gen, len(gen.ids),
                         lambda: completions.complete(state, req, gen, echo, request.receive),
                         None)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(state)]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> Response:
        if model_id != state.model_name:
            return _error(404, f"The model '{model_id}' does not exist", "not_found_error",
                          "model", "model_not_found")
        return JSONResponse(_model_card(state))

    @app.get("/health")
    async def health() -> JSONResponse:
        status, body = state.health()
        return JSONResponse(body, status_code=status)

    @app.get("/metrics")
    async def metrics() -> Response:
        stats = None
        if state.ready and state.engine is not None:
            try:
                stats = await state.engine.stats_async(timeout=10.0)
            except (GrammarserveError, TimeoutError):  # still export the server's own metrics
                stats = None
        grammar = state.compiler.cache_stats() if state.compiler is not None else None
        return Response(state.metrics.render(stats, grammar), media_type=CONTENT_TYPE_LATEST)

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest) -> dict[str, Any]:
        state.require_engine()
        if (req.prompt is None) == (req.messages is None):
            raise InvalidRequestError("give exactly one of 'prompt' and 'messages'",
                                      param="prompt")
        if req.messages is not None:
            tools = [t.model_dump(by_alias=True, exclude_none=True) for t in req.tools or []]
            text = render_chat(state.tokenizer, req.messages, tools=tools or None,
                               add_generation_prompt=req.add_generation_prompt)
        else:
            text = req.prompt or ""
        ids = list(state.tokenizer.encode(text, add_special_tokens=False))
        out: dict[str, Any] = {"count": len(ids), "max_model_len": state.max_model_len,
                               "tokens": ids}
        if req.return_token_strs:
            out["token_strs"] = state.tokenizer.convert_ids_to_tokens(ids)
        return out

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest) -> dict[str, Any]:
        state.require_engine()
        if any(not 0 <= t < len(state.tokenizer) for t in req.tokens):
            raise InvalidRequestError(f"token ids must be in [0, {len(state.tokenizer)})",
                                      param="tokens")
        return {"prompt": state.tokenizer.decode(req.tokens)}

    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


class _CountRequests:
    """Counts responses by route and status (pure ASGI: leaves streaming and disconnect
    detection untouched)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            path = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.requests.labels(path, str(status)).inc()


_ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, with the statuses the routes really return: client mistakes are 400
    with the OpenAI error envelope (never 422), an unknown id in the path 404, and 503 while
    loading or overloaded."""
    if app.openapi_schema is None:
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
        error = {"content": {"application/json": {"schema": _ERROR_SCHEMA}}}
        for path, methods in doc.get("paths", {}).items():
            for op in methods.values():
                responses = op.setdefault("responses", {})
                if responses.pop("422", None) is not None or "requestBody" in op:
                    responses["400"] = {"description": "Invalid request", **error}
                if "{" in path:
                    responses.setdefault("404", {"description": "Not found", **error})
                responses.setdefault("503", {"description": "Loading or overloaded", **error})
        app.openapi_schema = doc
    return app.openapi_schema


def _model_card(state: ServerState) -> dict[str, Any]:
    return {"id": state.model_name, "object": "model", "created": state.created,
            "owned_by": "grammarserve", "max_model_len": state.max_model_len or None}


async def _sse(events: AsyncIterator[dict[str, Any]], done: Callable[[], None]
               ) -> AsyncIterator[str]:
    """SSE framing; an error after the stream started is sent as ``data: {"error": ...}``."""
    try:
        async with aclosing(events) as it:  # type: ignore[type-var]
            async for event in it:
                yield f"data: {dumps(event)}\n\n"
        yield "data: [DONE]\n\n"
    except Exception as e:  # noqa: BLE001 - the status line is already sent
        body = json.loads(bytes(_exception_response(e).body))
        yield f"data: {dumps(body)}\n\n"
    finally:
        done()
