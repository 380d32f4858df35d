"""Pure ASGI middleware helpers (before any route runs): one JSON response, and handing on a
body the middleware has read."""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Message, Receive, Send


async def send_json(send: Send, status: int, body: dict[str, Any],
                    headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """Send ``body`` as a complete JSON response with ``status`` (and extra ``headers``)."""
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
        *(headers or [])]})
    await send({"type": "http.response.body", "body": data})


def replaying(first: Message, receive: Receive) -> Receive:
    """A ``receive`` for the app behind a middleware that read the whole body: ``first`` (the body
    as one message) once, then the server's own messages (e.g. the disconnect a stream watches
    for)."""
    pending = [first]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay
