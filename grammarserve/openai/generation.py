"""The engine requests behind one API request: submit them, collect or stream their outputs,
time them, and abort whatever is left when the client goes away.

It talks to the engine through :class:`EngineClient` (submit / abort), which the HTTP server's
state and the batch worker's engine both provide; it knows no HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from grammarserve.engine.request import RequestOutput
from grammarserve.engine.streams import AsyncRequestStream
from grammarserve.errors import GrammarserveError
from grammarserve.openai.prepare import Prepared
from grammarserve.sampling_params import SamplingParams

#: An ASGI ``receive`` (the disconnect watcher reads it); typed here so no HTTP import is needed.
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


class EngineClient(Protocol):
    """Where engine requests go: the server's engine process, as the routes and the batch worker
    see it."""

    def submit(self, request_id: str, prompt: list[int], params: SamplingParams,
               namespace: str) -> AsyncRequestStream:
        """Start one engine request; its outputs arrive on the returned stream."""
        ...

    def abort(self, request_id: str) -> None:
        """Stop an engine request (no-op if it already finished)."""
        ...


class _Histogram(Protocol):
    def observe(self, amount: float) -> None: ...


class Timings(Protocol):
    """Latency histograms (the server's metrics): time to first token, between tokens, and
    end to end."""

    @property
    def ttft(self) -> _Histogram: ...

    @property
    def itl(self) -> _Histogram: ...

    @property
    def e2e(self) -> _Histogram: ...


class Generation:
    """``len(prep.prompts)`` engine requests (one per choice) of one API request; the engine
    request ids are ``{base_id}-{i}`` (``base_id``: the reply's id unless given)."""

    def __init__(self, client: EngineClient, prep: Prepared, *, base_id: str | None = None,
                 timings: Timings | None = None) -> None:
        self.client = client
        self.prep = prep
        self.base_id = base_id or prep.id
        self.ids = [f"{self.base_id}-{i}" for i in range(len(prep.prompts))]
        self.timings = timings
        self.streams: list[AsyncRequestStream] = []
        self.finished: set[int] = set()
        self.t0 = time.perf_counter()
        self._queue: asyncio.Queue[tuple[int, RequestOutput | BaseException]] | None = None
        self._pumps: list[asyncio.Future[None]] = []
        self._primed: list[tuple[int, RequestOutput]] = []
        self._last: dict[int, float] = {}

    def start(self) -> None:
        """Submit every choice (aborting the ones already submitted if one fails)."""
        try:
            for rid, prompt, params in zip(self.ids, self.prep.prompts, self.prep.params):
                self.streams.append(self.client.submit(rid, prompt, params, self.prep.namespace))
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        for i, stream in enumerate(self.streams):
            if i not in self.finished:
                self.client.abort(stream.request_id)

    def _observe(self, name: str, seconds: float) -> None:
        if self.timings is not None:
            getattr(self.timings, name).observe(seconds)

    async def results(self, receive: Receive | None = None) -> list[RequestOutput] | None:
        """Final outputs of every choice; None (and every choice aborted) if the client
        disconnects first."""

        async def one(i: int) -> RequestOutput:
            first = True
            async for out in self.streams[i]:
                if first and out.token_ids:
                    self._observe("ttft", time.perf_counter() - self.t0)
                    first = False
                if out.finished:
                    self.finished.add(i)
                    self.prep.check_output(out)
                    return out
            raise GrammarserveError("the engine stream ended without a final output")

        work = asyncio.gather(*(one(i) for i in range(len(self.streams))))
        watcher = asyncio.ensure_future(_disconnected(receive)) if receive else None
        try:
            if watcher is None:
                outs = await work
            else:
                both: set[asyncio.Future[Any]] = {work, watcher}
                done, _ = await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
                if work not in done:
                    work.cancel()
                    with contextlib.suppress(BaseException):
                        await work
                    return None
                outs = work.result()
        finally:
            if watcher is not None:
                watcher.cancel()
            self.abort()
        self._observe("e2e", time.perf_counter() - self.t0)
        return list(outs)

    def _pumped(self) -> asyncio.Queue[tuple[int, RequestOutput | BaseException]]:
        """The queue every choice's outputs (or its error) arrive on, interleaved."""
        if self._queue is None:
            queue: asyncio.Queue[tuple[int, RequestOutput | BaseException]] = asyncio.Queue()
            self._queue = queue

            async def pump(i: int) -> None:
                try:
                    async for out in self.streams[i]:
                        await queue.put((i, out))
                except BaseException as e:  # noqa: BLE001 - delivered to the consumer
                    await queue.put((i, e))

            self._pumps = [asyncio.ensure_future(pump(i)) for i in range(len(self.streams))]
        return self._queue

    async def _next(self) -> tuple[int, RequestOutput]:
        """The next output of any choice: timed, and checked if it is a choice's last; a
        choice's error is raised."""
        i, item = await self._pumped().get()
        if isinstance(item, BaseException):
            self.finished.add(i)
            raise item
        now = time.perf_counter()
        if item.token_ids:
            if i in self._last:
                self._observe("itl", now - self._last[i])
            else:
                self._observe("ttft", now - self.t0)
            self._last[i] = now
        if item.finished:
            self.finished.add(i)
            self.prep.check_output(item)
        return i, item

    def _close(self) -> None:
        for t in self._pumps:
            t.cancel()
        self.abort()

    async def prime(self) -> None:
        """Wait until every choice has its first output (kept for :meth:`stream`), so a
        request that fails before its first token (a constraint the engine refuses, a prompt
        it cannot take) raises here, before a stream's status line is sent: the same 400 as
        without streaming. Everything is aborted if it raises."""
        started: set[int] = set()
        try:
            while len(started) < len(self.streams):
                i, item = await self._next()
                started.add(i)
                self._primed.append((i, item))
        except BaseException:
            self._close()
            raise

    async def stream(self) -> AsyncGenerator[tuple[int, RequestOutput], None]:
        """``(choice index, output)`` as they arrive, all choices interleaved (those
        :meth:`prime` took first)."""
        try:
            primed, self._primed = self._primed, []
            for i, item in primed:
                yield i, item
            while len(self.finished) < len(self.streams):
                yield await self._next()
            self._observe("e2e", time.perf_counter() - self.t0)
        finally:
            self._close()


async def _disconnected(receive: Receive) -> None:
    """Returns when the ASGI server reports that the client went away."""
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            return
