"""The FastAPI application: exception handlers (the OpenAI error envelope, from the protocol
layer's one status table), the generating routes (:mod:`~grammarserve.server.inference`), the
batch API, models, health, metrics, tokenize."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from grammarserve.engine.validate import check_token_ids
from grammarserve.errors import ErrorKind, GrammarserveError, InvalidRequestError
from grammarserve.openai.errors import error_response, kind_response, validation_error
from grammarserve.openai.protocol import DetokenizeRequest, TokenizeRequest
from grammarserve.openai.render import render_chat
from grammarserve.server import batches, inference
from grammarserve.server.auth import ApiKeyAuth
from grammarserve.server.config import ServerConfig
from grammarserve.server.depth import JsonDepthLimit
from grammarserve.server.limits import BodyLimit
from grammarserve.server.metrics import ServerMetrics
from grammarserve.server.state import ServerState

log = logging.getLogger(__name__)


def exception_response(e: BaseException) -> JSONResponse:
    """Any exception as the OpenAI error envelope, with the status of its error kind."""
    status, body = error_response(e)
    return JSONResponse(body, status_code=status)


def validation_response(e: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 as an OpenAI 400 naming the param (``messages[0].role``)."""
    return exception_response(validation_error(e.errors()))


def create_app(config: ServerConfig, *, on_failure: Callable[[str], None] | None = None,
               state: ServerState | None = None,
               clock: Callable[[], float] = time.time) -> FastAPI:
    """Build the app; the engine starts loading when the app starts (``/health`` answers 503
    until it is ready). ``state``: a :class:`ServerState` of another kind of engine (the Ray
    ingress passes one whose engine is its replicas); default: one engine process. ``clock``:
    the batch API's wall clock (its recorded times and file expiry; tests move it)."""
    state = state or ServerState(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.start(on_failure)
        yield
        state.shutdown()

    app = FastAPI(title="grammarserve", version="0.1.0", lifespan=lifespan)
    app.state.gs = state
    # Outermost last: counting sees every answer; keys are checked before a body is read.
    app.add_middleware(JsonDepthLimit, max_depth=config.max_json_depth, exempt=_is_upload)
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes, exempt=_is_upload)
    app.add_middleware(ApiKeyAuth, keys=config.api_keys)
    app.add_middleware(_CountRequests, metrics=state.metrics)
    app.include_router(inference.router(state))  # chat, completions, responses
    app.include_router(batches.router(state, clock=clock))  # files, batches, the batch worker

    @app.exception_handler(RequestValidationError)
    async def _on_validation(_: Request, e: RequestValidationError) -> JSONResponse:
        return validation_response(e)

    @app.exception_handler(HTTPException)
    async def _on_http(_: Request, e: HTTPException) -> JSONResponse:
        if e.status_code == 404:
            status, body = kind_response(ErrorKind.NOT_FOUND, str(e.detail))
        else:  # 405 and the like: the route exists, the request is wrong
            status, body = kind_response(ErrorKind.INVALID_REQUEST, str(e.detail))
            status = e.status_code
        return JSONResponse(body, status_code=status)

    @app.exception_handler(Exception)
    async def _on_error(_: Request, e: Exception) -> JSONResponse:
        return exception_response(e)

    @app.exception_handler(GrammarserveError)
    async def _on_grammarserve_error(_: Request, e: GrammarserveError) -> JSONResponse:
        return exception_response(e)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        state.require_engine()  # 503 while no engine serves the model
        return {"object": "list", "data": [_model_card(state)]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> Response:
        state.require_engine()
        if model_id not in _served_ids(state):
            status, body = kind_response(ErrorKind.NOT_FOUND,
                                         f"The model '{model_id}' does not exist", "model",
                                         "model_not_found")
            return JSONResponse(body, status_code=status)
        return JSONResponse({**_model_card(state), "id": model_id})

    @app.get("/health")
    async def health() -> JSONResponse:
        status, body = state.health()
        return JSONResponse(body, status_code=status)

    @app.get("/metrics")
    async def metrics() -> Response:
        # NOTE: a long engine step must not hold up a scrape: at most 0.5 s, then the
        # counters the engine published last
        stats = await state.engine.recent_stats() if state.engine is not None else None
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
        ctx = state.require_context()
        if ctx.vocab_size is not None:
            check_token_ids(req.tokens, vocab_size=ctx.vocab_size, param="tokens")
        return {"prompt": ctx.tokenizer.decode(req.tokens)}

    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _is_upload(scope: Scope) -> bool:
    """``POST /v1/files``: streamed to disk under its own limit, not buffered."""
    return bool(scope["method"] == "POST" and scope["path"] == "/v1/files")


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


def _served_ids(state: ServerState) -> set[str]:
    """The ids the one model answers to: its reported name and the name it was started with
    (``default``, a path, its folder's name)."""
    given = state.config.engine.model
    return {state.model_name, given, Path(given).name} - {""}


def _model_card(state: ServerState) -> dict[str, Any]:
    return {"id": state.model_name, "object": "model", "created": state.created,
            "owned_by": "grammarserve", "max_model_len": state.max_model_len or None}

