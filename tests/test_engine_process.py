"""EngineProcess: the engine in its own process, streaming, stats, errors and crash reporting."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from grammarserve.config import EngineConfig
from grammarserve.engine.process import EngineProcess
from grammarserve.errors import EngineDeadError, GrammarserveError, InvalidRequestError
from grammarserve.llm import LLM
from grammarserve.sampling_params import SamplingParams

CFG = EngineConfig(device="cpu", kv_cache_tokens=4096, max_num_reqs=8, num_threads=1)


@pytest.fixture(scope="module")
def proc(smollm):  # type: ignore[no-untyped-def]
    p = EngineProcess(CFG)
    yield p
    p.shutdown()


@pytest.mark.model
def test_streams_same_tokens_as_in_process(proc: EngineProcess, llm: LLM) -> None:
    prompt = "The three primary colours are"
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    outs = list(proc.add_request("s1", prompt, params))
    assert len(outs) == 16 and outs[-1].finished and not any(o.finished for o in outs[:-1])
    assert "".join(o.delta_text for o in outs) == outs[-1].text
    assert outs[-1].token_ids == llm.generate(prompt, params)[0].token_ids
    st = proc.stats()
    assert st.generated_tokens >= 16 and st.running_requests == 0
    assert proc.info["kv_capacity"] == 4096 and proc.info["kv_bytes_per_token"] == 46080
    # start-up's objects (torch, transformers, the tokenizer) are out of the collector's reach
    assert proc.info["gc_frozen_objects"] > 100_000


@pytest.mark.model
def test_a_stats_call_given_up_leaves_the_outputs_flowing(proc: EngineProcess) -> None:
    """A stats caller that timed out (a forward of minutes: a large model on a busy CPU)
    cancelled its future; the answer that comes later is dropped, and the reader that
    delivers every request's outputs lives on."""
    given_up = proc._request_stats()
    given_up.cancel()
    assert proc.stats().kv_capacity == 4096
    outs = list(proc.add_request("after-give-up", "Hello", SamplingParams(max_tokens=2)))
    assert outs[-1].finished and proc.info["memory_plan"].kv_tokens == 4096


@pytest.mark.model
def test_async_stream_matches_blocking_stream(proc: EngineProcess) -> None:
    prompt = "List three fruits:"
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    blocking = proc.add_request("sync1", prompt, params).result(timeout=60)

    async def run() -> tuple[list[str], list[int], int]:
        a = proc.add_request_async("async1", prompt, params)
        b = proc.add_request_async("async2", [10**9], params)
        deltas = [out.delta_text async for out in a]
        with pytest.raises(InvalidRequestError, match="token ids"):
            await b.result(timeout=60)
        stats = await proc.stats_async()
        return deltas, (await _final(proc, prompt, params)).token_ids, stats.generated_tokens

    deltas, ids, generated = asyncio.run(run())
    assert "".join(deltas) == blocking.text and ids == blocking.token_ids
    assert generated >= 24


async def _final(proc: EngineProcess, prompt: str, params: SamplingParams):  # type: ignore[no-untyped-def]
    return await proc.add_request_async("async3", prompt, params).result(timeout=60)


@pytest.mark.model
def test_bad_request_fails_only_itself(proc: EngineProcess) -> None:
    good = proc.add_request("g", "Hello", SamplingParams(max_tokens=4, temperature=0))
    bad = proc.add_request("b", [10**9], SamplingParams(max_tokens=4))
    with pytest.raises(InvalidRequestError, match="token ids"):
        bad.result(timeout=60)
    assert good.result(timeout=60).finished


@pytest.mark.model
def test_abort_in_process(proc: EngineProcess) -> None:
    s = proc.add_request("ab", "Count to one hundred:",
                         SamplingParams(max_tokens=500, temperature=0, ignore_eos=True))
    s.get(timeout=60)
    proc.abort("ab")
    assert s.result(timeout=60).finish_reason == "abort"


@pytest.mark.model
def test_killed_engine_is_reported_not_hung(smollm) -> None:  # type: ignore[no-untyped-def]
    p = EngineProcess(CFG)
    try:
        s = p.add_request("k", "Tell me a long story.",
                          SamplingParams(max_tokens=1000, temperature=0, ignore_eos=True))
        s.get(timeout=60)
        assert p.pid is not None
        os.kill(p.pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(EngineDeadError, match="died"):
            s.result(timeout=30)
        assert time.monotonic() - t0 < 30
        with pytest.raises(EngineDeadError):
            p.add_request("k2", "hi", SamplingParams(max_tokens=2))
    finally:
        p.shutdown()


def test_startup_failure_is_one_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(GrammarserveError, match="does not exist"):
        EngineProcess(EngineConfig(model=str(tmp_path / "nope"), device="cpu",
                                   kv_cache_tokens=16))
