"""Request body size: a body over the limit is refused with 413 while it is read (a declared
``Content-Length`` over it before reading anything; a chunked body as soon as the bytes read pass
it), so no client can make the server hold more than the limit per request.

``/v1/files`` uploads are exempt here: the route streams them to disk under their own limit
(:mod:`grammarserve.server.uploads`).
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from grammarserve.errors import ErrorKind
from grammarserve.openai.errors import kind_response
from grammarserve.server.respond import replaying, send_json

_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})


def too_large(what: str, limit: int) -> tuple[int, dict[str, object]]:
    """The 413 of a body or upload over ``limit`` bytes."""
    return kind_response(ErrorKind.TOO_LARGE, f"the {what} is larger than this server's limit "
                         f"of {limit} bytes")


def declared_length(headers: Headers) -> int | None:
    """``Content-Length`` as an int (None if absent or not a number)."""
    try:
        return int(headers["content-length"])
    except (KeyError, ValueError):
        return None


class BodyLimit:
    """Pure ASGI middleware: reads a request body up to ``max_bytes`` (413 beyond), then hands
    it to the app in one piece."""

    def __init__(self, app: ASGIApp, max_bytes: int,
                 exempt: Callable[[Scope], bool] = lambda _: False) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _WITH_BODY or self.exempt(scope):
            await self.app(scope, receive, send)
            return
        size = declared_length(Headers(scope=scope))
        if size is not None and size > self.max_bytes:
            await send_json(send, *too_large("request body", self.max_bytes))
            return
        chunks: list[bytes] = []
        read = 0
        first: Message | None = None
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away mid-body
                first = message
                break
            chunk = message.get("body", b"")
            read += len(chunk)
            if read > self.max_bytes:
                await send_json(send, *too_large("request body", self.max_bytes))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        if first is None:
            first = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        chunks.clear()
        await self.app(scope, replaying(first, receive), send)
