"""Request JSON nesting: a JSON body nested deeper than the limit is refused with a 400 before
any parser sees it (see :mod:`grammarserve.openai.depth`)."""

from __future__ import annotations

from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from grammarserve.errors import InvalidRequestError
from grammarserve.openai.depth import check_json_depth
from grammarserve.openai.errors import error_response
from grammarserve.server.respond import replaying, send_json

_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})


class JsonDepthLimit:
    """Pure ASGI middleware: reads a request body (its size is bounded by
    :class:`~grammarserve.server.limits.BodyLimit`, outside it), refuses it if its JSON nests
    deeper than ``max_depth``, else hands it on in one piece. Multipart bodies and the
    ``exempt`` routes (uploads, streamed to disk) pass untouched."""

    def __init__(self, app: ASGIApp, max_depth: int,
                 exempt: Callable[[Scope], bool] = lambda _: False) -> None:
        self.app = app
        self.max_depth = max_depth
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _WITH_BODY or self.exempt(scope) or (
                Headers(scope=scope).get("content-type", "").startswith("multipart/")):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        first: Message | None = None
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away mid-body
                first = message
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        chunks.clear()
        if first is None:
            try:
                check_json_depth(body, self.max_depth)
            except InvalidRequestError as e:
                await send_json(send, *error_response(e))
                return
            first = {"type": "http.request", "body": body, "more_body": False}
        await self.app(scope, replaying(first, receive), send)
