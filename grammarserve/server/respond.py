"""Answering from pure ASGI middleware (before any route runs): one JSON response."""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Send


async def send_json(send: Send, status: int, body: dict[str, Any],
                    headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """Send ``body`` as a complete JSON response with ``status`` (and extra ``headers``)."""
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
        *(headers or [])]})
    await send({"type": "http.response.body", "body": data})
