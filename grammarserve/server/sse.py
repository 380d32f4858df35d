"""Server-sent events framing of a reply's events, errors after the status line included."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from grammarserve.openai.bodies import dumps
from grammarserve.openai.errors import error_response


async def sse(events: AsyncIterator[dict[str, Any]], done: Callable[[], None], *,
              typed: bool = False) -> AsyncIterator[str]:
    """Frame ``events``; ``done()`` runs when the stream ends, however it ends.

    Chat and completions (``typed=False``): ``data: {...}`` lines, then ``data: [DONE]``; an
    error after the stream started is sent as ``data: {"error": ...}`` (the SDK raises it).
    The Responses API (``typed=True``): each event as ``event: {type}`` plus ``data: {...}``, no
    ``[DONE]``; an error is an ``error`` event (``{type, code, message, param,
    sequence_number}``).
    """
    sent = 0
    try:
        async with aclosing(events) as it:  # type: ignore[type-var]
            async for event in it:
                head = f"event: {event['type']}\n" if typed else ""
                yield f"{head}data: {dumps(event)}\n\n"
                sent += 1
        if not typed:
            yield "data: [DONE]\n\n"
    except Exception as e:  # noqa: BLE001 - the status line is already sent
        _, body = error_response(e)
        if typed:
            err = body["error"]
            event = {"type": "error", "code": err["code"] or err["type"],
                     "message": err["message"], "param": err["param"], "sequence_number": sent}
            yield f"event: error\ndata: {dumps(event)}\n\n"
        else:
            yield f"data: {dumps(body)}\n\n"
    finally:
        done()
