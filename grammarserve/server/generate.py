"""The engine requests behind one API request: submit them, collect or stream their outputs,
time them, and abort whatever is left when the client goes away."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator
from typing import Any

from starlette.types import Receive

from grammarserve.engine.process import AsyncRequestStream
from grammarserve.engine.request import RequestOutput
from grammarserve.errors import GrammarserveError, InvalidRequestError
from grammarserve.sampling_params import SamplingParams
from grammarserve.server.state import ServerState

#: Engine error texts that mean the request's constraint was at fault (400, not 500). A
#: constraint "cannot be completed" when it requires text the model's tokenizer cannot produce
#: (e.g. a character whose bytes have no token): every mask is sound, yet nothing can follow.
_CLIENT_ERRORS = ("invalid constraint", "the constraint cannot be completed")


class Generation:
    """``len(prompts)`` engine requests (one per choice) of one API request."""

    def __init__(self, state: ServerState, base_id: str, prompts: list[list[int]],
                 params: list[SamplingParams], *, namespace: str,
                 constraint_param: str | None) -> None:
        self.state = state
        self.base_id = base_id
        self.ids = [f"{base_id}-{i}" for i in range(len(prompts))]
        self.prompts = prompts
        self.params = params
        self.namespace = namespace
        self.constraint_param = constraint_param
        self.streams: list[AsyncRequestStream] = []
        self.finished: set[int] = set()
        self.t0 = time.perf_counter()

    def start(self) -> None:
        """Submit every choice (aborting the ones already submitted if one fails)."""
        try:
            for rid, prompt, params in zip(self.ids, self.prompts, self.params):
                self.streams.append(self.state.submit(rid, prompt, params, self.namespace))
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        for i, stream in enumerate(self.streams):
            if i not in self.finished:
                self.state.abort(stream.request_id)

    def check(self, out: RequestOutput) -> None:
        """Raise for an engine-side failure of one choice."""
        if out.finish_reason != "error":
            return
        message = out.error or "generation failed"
        if message.startswith(_CLIENT_ERRORS):
            raise InvalidRequestError(message, param=self.constraint_param)
        raise GrammarserveError(message)

    async def results(self, receive: Receive | None = None) -> list[RequestOutput] | None:
        """Final outputs of every choice; None (and every choice aborted) if the client
        disconnects first."""

        async def one(i: int) -> RequestOutput:
            first = True
            async for out in self.streams[i]:
                if first and out.token_ids:
                    self.state.metrics.ttft.observe(time.perf_counter() - self.t0)
                    first = False
                if out.finished:
                    self.finished.add(i)
                    self.check(out)
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
        self.state.metrics.e2e.observe(time.perf_counter() - self.t0)
        return list(outs)

    async def stream(self) -> AsyncGenerator[tuple[int, RequestOutput], None]:
        """``(choice index, output)`` as they arrive, all choices interleaved."""
        queue: asyncio.Queue[tuple[int, RequestOutput | BaseException]] = asyncio.Queue()

        async def pump(i: int) -> None:
            try:
                async for out in self.streams[i]:
                    await queue.put((i, out))
            except BaseException as e:  # delivered to the consumer below
                await queue.put((i, e))

        tasks = [asyncio.ensure_future(pump(i)) for i in range(len(self.streams))]
        last: dict[int, float] = {}
        try:
            while len(self.finished) < len(self.streams):
                i, item = await queue.get()
                if isinstance(item, BaseException):
                    self.finished.add(i)
                    raise item
                now = time.perf_counter()
                if item.token_ids:
                    if i in last:
                        self.state.metrics.itl.observe(now - last[i])
                    else:
                        self.state.metrics.ttft.observe(now - self.t0)
                    last[i] = now
                if item.finished:
                    self.finished.add(i)
                    self.check(item)
                yield i, item
            self.state.metrics.e2e.observe(time.perf_counter() - self.t0)
        finally:
            for t in tasks:
                t.cancel()
            self.abort()


async def _disconnected(receive: Receive) -> None:
    """Returns when the ASGI server reports that the client went away."""
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            return
