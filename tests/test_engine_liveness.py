"""The engine client sees every death and every stall, and no wait on the engine is unbounded
(``engine/process.py``): a stopped engine (SIGSTOP) is told at once and declared dead after
its stall timeout; one continued in time goes on; a late answer to a given-up stats call and a
message that cannot be delivered leave the outputs flowing; sending never blocks the caller;
a kill or a native crash while decoding answers every waiter. Each case uses a real engine
process on the embedded model and real signals; the waits are on the engine's own events
(a first output, ``wait_dead``, ``/proc`` state), never on a clock guess."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import pytest

from grammarserve.config import EngineConfig
from grammarserve.engine.liveness import process_stopped
from grammarserve.engine.process import EngineProcess
from grammarserve.errors import EngineDeadError, InvalidRequestError
from grammarserve.sampling_params import SamplingParams

pytestmark = pytest.mark.model

CFG = EngineConfig(device="cpu", kv_cache_tokens=4096, max_num_reqs=8, num_threads=1)
STALL_S = 3.0
LONG = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)


def _engine() -> Iterator[EngineProcess]:
    p = EngineProcess(CFG, stall_timeout_s=STALL_S)
    yield p
    if p.pid is not None and process_stopped(p.pid):
        os.kill(p.pid, signal.SIGCONT)
    p.shutdown()


@pytest.fixture
def engine(smollm) -> Iterator[EngineProcess]:  # type: ignore[no-untyped-def]
    """An engine of the test's own (the test kills it)."""
    yield from _engine()


@pytest.fixture(scope="module")
def shared(smollm) -> Iterator[EngineProcess]:  # type: ignore[no-untyped-def]
    """An engine the tests that leave it running share."""
    yield from _engine()


def _stop(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    for _ in range(100_000):  # one /proc read each; stopping takes microseconds
        if process_stopped(pid):
            return
        os.sched_yield()
    raise AssertionError(f"process {pid} did not stop")


def test_a_stopped_engine_is_told_at_once_and_declared_dead_after_its_stall_timeout(
        engine: EngineProcess) -> None:
    stream = engine.add_request("stopped", "Once upon a time", LONG)
    first = stream.get(timeout=60)
    assert first.token_ids and not first.finished
    assert engine.pid is not None and engine.trouble() is None
    t0 = time.monotonic()
    _stop(engine.pid)
    assert engine.trouble() == "the engine process is stopped (SIGSTOP)"
    with pytest.raises(EngineDeadError, match="stopped"):
        for _ in stream:
            pass
    waited = time.monotonic() - t0
    assert engine.wait_dead(30) and engine.stalled and not engine.crashed_by_request
    assert STALL_S <= waited < STALL_S + 10, waited
    assert engine.exitcode == -signal.SIGKILL
    with pytest.raises(EngineDeadError):
        engine.add_request("after", "Hi", SamplingParams(max_tokens=2))
    with pytest.raises(EngineDeadError):
        engine.stats(timeout=5)


def test_a_long_stop_shorter_than_the_timeout_is_survived_and_stats_never_wait_for_it(
        shared: EngineProcess) -> None:
    """The original hang: a stats caller gave up during a long step (here: a stop) and the
    late answer killed the reader. Now the caller gets the published counters within its
    bound, and the outputs flow once the engine runs again."""
    stream = shared.add_request("paused", "Once upon a time",
                                SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    assert stream.get(timeout=60).token_ids
    assert shared.pid is not None
    _stop(shared.pid)

    async def scrape() -> tuple[float, object]:
        t = time.monotonic()
        stats = await shared.recent_stats(wait_s=0.3)
        return time.monotonic() - t, stats

    took, stats = asyncio.run(scrape())
    assert took < 2.0
    assert stats is None or stats.kv_capacity == 4096  # type: ignore[attr-defined]
    given_up = shared._request_stats()
    given_up.cancel()  # its answer arrives after the stop and is dropped
    os.kill(shared.pid, signal.SIGCONT)
    outs = list(stream)
    assert outs[-1].finished and len(outs[-1].token_ids) == 24
    assert shared.stats(timeout=30).kv_capacity == 4096
    assert shared.trouble() is None and shared.reader_errors == 0


def test_sending_never_blocks_the_caller(shared: EngineProcess) -> None:
    """A request larger than the pipe's buffer, sent while the engine cannot read: the caller
    returns at once (the sender thread waits), and the engine answers once it runs."""
    assert shared.pid is not None
    _stop(shared.pid)
    t = time.monotonic()
    stream = shared.add_request("big", "word " * 400_000, SamplingParams(max_tokens=2))
    assert time.monotonic() - t < 1.0
    os.kill(shared.pid, signal.SIGCONT)
    with pytest.raises(InvalidRequestError):  # longer than the context
        stream.result(timeout=120)
    outs = list(shared.add_request("small", "Hi", SamplingParams(max_tokens=2)))
    assert outs[-1].finished


def test_an_output_that_cannot_be_delivered_does_not_stop_the_others(
        shared: EngineProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    from grammarserve.engine.streams import RequestStream

    real_put = RequestStream.put

    def put(self: RequestStream, item: object) -> None:
        if self.request_id == "broken":
            raise RuntimeError("a consumer bug")
        real_put(self, item)  # type: ignore[arg-type]

    monkeypatch.setattr(RequestStream, "put", put)
    shared.add_request("broken", "Hello", SamplingParams(max_tokens=4))
    outs = list(shared.add_request("fine", "Hello", SamplingParams(max_tokens=4)))
    assert outs[-1].finished and shared.reader_errors >= 1 and shared.trouble() is None


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
def test_a_death_while_decoding_answers_every_waiter_and_blames_no_request(
        engine: EngineProcess, sig: signal.Signals) -> None:
    streams = [engine.add_request(f"r{i}", "Once upon a time", LONG) for i in range(3)]
    assert streams[0].get(timeout=60).token_ids
    assert engine.pid is not None
    os.kill(engine.pid, sig)
    for s in streams:
        with pytest.raises(EngineDeadError, match="exit code"):
            s.result(timeout=30)
    assert engine.wait_dead(5) and not engine.crashed_by_request and not engine.stalled
    assert engine.exitcode == -sig
