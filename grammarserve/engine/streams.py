"""What a caller reads a request's outputs from: :class:`RequestStream` (blocking: ``get``,
iteration, ``result``) and :class:`AsyncRequestStream` (asyncio: ``await get()``, ``async
for``). The engine client puts each :class:`RequestOutput` (or the exception that ended the
request) into the request's stream from its reader thread."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Iterator

from grammarserve.engine.request import RequestOutput


class RequestStream:
    """Outputs of one request, in order; iteration ends after the finished output."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._queue: queue.Queue[RequestOutput | BaseException] = queue.Queue()

    def put(self, item: RequestOutput | BaseException) -> None:
        self._queue.put(item)

    def get(self, timeout: float | None = None) -> RequestOutput:
        """Next output; raises the engine's error for this request if there was one."""
        item = self._queue.get(timeout=timeout)
        if isinstance(item, BaseException):
            raise item
        return item

    def __iter__(self) -> Iterator[RequestOutput]:
        while True:
            out = self.get()
            yield out
            if out.finished:
                return

    def result(self, timeout: float | None = None) -> RequestOutput:
        """Block until the request finishes; returns its final output."""
        while True:
            out = self.get(timeout=timeout)
            if out.finished:
                return out


class AsyncRequestStream(RequestStream):
    """A :class:`RequestStream` for asyncio: ``await get()`` and ``async for``.

    ``put`` may be called from any thread; items reach the event loop that created the stream.
    """

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(request_id)
        self._loop = loop
        self._aqueue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

    def put(self, item: RequestOutput | BaseException) -> None:
        try:
            self._loop.call_soon_threadsafe(self._aqueue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    async def get(self, timeout: float | None = None) -> RequestOutput:  # type: ignore[override]
        """Next output; raises the engine's error for this request if there was one."""
        item = await asyncio.wait_for(self._aqueue.get(), timeout)
        if isinstance(item, BaseException):
            raise item
        return item

    def __iter__(self) -> Iterator[RequestOutput]:
        raise TypeError("AsyncRequestStream is iterated with 'async for'")

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        while True:
            out = await self.get()
            yield out
            if out.finished:
                return

    async def result(self, timeout: float | None = None) -> RequestOutput:  # type: ignore[override]
        """Wait until the request finishes; returns its final output."""
        while True:
            out = await self.get(timeout=timeout)
            if out.finished:
                return out
