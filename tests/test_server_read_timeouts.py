"""Read timeouts for headers and bodies (issue 33 item 5, ``server/timeouts.py``): raw sockets
that send headers or a body slowly are answered 408 and closed within the configured timeout;
a request that arrives in time, or a body that keeps coming, is served."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from server_helpers import free_port
from waiting import wait_until

from grammarserve.server.timeouts import ReadTimeouts, protocol_class

HEADER_S, BODY_S = 0.6, 0.6


async def _echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the whole body, answers its length."""
    if scope["type"] != "http":
        return
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = str(size).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    port = free_port()
    config = uvicorn.Config(_echo, host="127.0.0.1", port=port, log_level="error",
                            http=protocol_class(ReadTimeouts(header_s=HEADER_S, body_s=BODY_S)),
                            timeout_keep_alive=30, lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10, "uvicorn to start", interval_s=0.02)
    yield port
    server.should_exit = True
    thread.join(10)


def _trickle(port: int, parts: list[bytes], pause_s: float) -> tuple[bytes, float]:
    """Send ``parts`` with ``pause_s`` between them (stopping when the server closes); return
    what came back and the seconds from the connection's opening to its close."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(10)
    start = time.monotonic()
    try:
        for part in parts:
            try:
                sock.sendall(part)
            except OSError:
                break  # closed by the server
            time.sleep(pause_s)  # the client's pace: the behaviour under test, not a wait
        received = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            received += chunk
        return received, time.monotonic() - start
    finally:
        sock.close()


REQUEST = (b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
           b"content-length: 20\r\n\r\n")


def test_slow_headers_get_408_and_are_closed(port: int) -> None:
    parts = [REQUEST[i:i + 4] for i in range(0, len(REQUEST), 4)]  # ~25 parts
    received, took = _trickle(port, parts, 0.1)
    assert received.startswith(b"HTTP/1.1 408")
    assert b'"code": "request_timeout"' in received and b"headers" in received
    assert HEADER_S - 0.05 <= took < HEADER_S + 1.5


def test_a_silent_connection_is_closed(port: int) -> None:
    received, took = _trickle(port, [], 0)
    assert received.startswith(b"HTTP/1.1 408") and took < HEADER_S + 1.5


def test_a_stalled_body_gets_408_and_is_closed(port: int) -> None:
    received, took = _trickle(port, [REQUEST + b"12345"], 0)
    assert received.startswith(b"HTTP/1.1 408") and b"body" in received
    assert BODY_S - 0.05 <= took < BODY_S + 1.5


def test_a_body_that_keeps_coming_is_served(port: int) -> None:
    body = [b"1234"] * 5  # 20 bytes over 5 x 0.25 s: longer than BODY_S, no pause as long
    closing = REQUEST.replace(b"host: t\r\n", b"host: t\r\nconnection: close\r\n")
    received, _ = _trickle(port, [closing] + body, 0.25)
    assert received.startswith(b"HTTP/1.1 200") and received.endswith(b"20")


def test_a_second_request_on_a_kept_connection_has_its_own_header_timeout(port: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(10)
    try:
        sock.sendall(REQUEST + b"x" * 20)
        first = b""
        while not first.endswith(b"\r\n\r\n20"):
            first += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        # NOTE: idle between requests on purpose (the behaviour under test, not a wait): past
        # HEADER_S is the keep-alive timeout's business, not the header timeout's.
        time.sleep(HEADER_S + 0.2)
        sock.sendall(b"GET /x HTTP/1.1\r\n")
        start = time.monotonic()
        second = sock.recv(65536)
        assert second.startswith(b"HTTP/1.1 408")
        assert time.monotonic() - start < HEADER_S + 1.5
    finally:
        sock.close()


def test_timeouts_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ReadTimeouts(header_s=0)
