"""Read timeouts for request headers and bodies (issue 33 item 5).

uvicorn's ``timeout_keep_alive`` only closes a connection idle *between* requests: a client
that sends its headers, or its body, one byte at a time keeps a connection (and, for the body,
a request task) open for as long as it likes. :func:`protocol_class` gives uvicorn an HTTP
protocol (its ``httptools`` one, the default) with two more timers:

- ``header_s``: the whole header block of a request must arrive within it, from the first
  byte of the request (or from the connection's opening);
- ``body_s``: the longest wait for the next bytes of a body that is not complete (nginx's
  ``client_body_timeout``: a body that keeps coming is never cut off, a stalled one is).

When one fires before a response has started the client gets a ``408`` with the OpenAI error
envelope and ``connection: close``; the connection is then closed (the request's task sees a
disconnect).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from grammarserve.errors import InvalidRequestError


@dataclass(frozen=True)
class ReadTimeouts:
    """Seconds a request's headers may take, and the longest pause inside its body."""

    header_s: float = 10.0
    body_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("header_s", "body_s"):
            if not getattr(self, name) > 0:
                raise InvalidRequestError(f"the {name[:-2]} read timeout must be > 0 seconds",
                                          param=f"{name[:-2]}_timeout")


def _timeout_response(what: str, seconds: float) -> bytes:
    body = json.dumps({"error": {
        "message": f"the request's {what} did not arrive within {seconds:g} s",
        "type": "invalid_request_error", "param": None, "code": "request_timeout"}}).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
            + body)


class ReadTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header and body read timeouts (``timeouts``)."""

    timeouts = ReadTimeouts()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_timer: asyncio.TimerHandle | None = None
        self._reading: str | None = None  # what the timer waits for: "headers" or "body"

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(seconds, self._timed_out, what, seconds)
        self._reading = what

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
        self._read_timer, self._reading = None, None

    def _timed_out(self, what: str, seconds: float) -> None:
        self._read_timer, self._reading = None, None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete or not cycle.response_started:
            self.transport.write(_timeout_response(what, seconds))
        self.transport.close()

    # -- the timers' start and end ------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.timeouts.header_s, "headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        cycle = self.cycle
        if self._reading == "body" and cycle is not None and cycle.more_body:
            self._arm(self.timeouts.body_s, "body")  # bytes came: the pause starts again

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._reading != "headers":
            self._arm(self.timeouts.header_s, "headers")

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        if self.parser.should_upgrade():
            return
        length = dict(self.headers).get(b"content-length")
        chunked = b"chunked" in dict(self.headers).get(b"transfer-encoding", b"").lower()
        if chunked or (length is not None and length.strip() not in (b"", b"0")):
            self._arm(self.timeouts.body_s, "body")

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()


def protocol_class(timeouts: ReadTimeouts) -> type[ReadTimeoutProtocol]:
    """The protocol class to give ``uvicorn.Config(http=...)``, with ``timeouts``."""
    return type("ReadTimeoutProtocol", (ReadTimeoutProtocol,), {"timeouts": timeouts})
