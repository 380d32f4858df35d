"""Stall-free mixing (``engine/step_pacer.py``): while requests decode, a long prompt's prefill
is cut to what fits the step-time target by measured cost, decode rows first; with nothing
decoding, the whole token budget."""

from __future__ import annotations

import pytest

from grammarserve.config import EngineConfig
from grammarserve.engine.engine import Engine
from grammarserve.engine.step_pacer import StepPacer
from grammarserve.errors import InvalidRequestError
from grammarserve.sampling_params import SamplingParams


def test_the_cap_fits_the_target_by_measured_cost() -> None:
    pacer = StepPacer(target_s=0.5, max_tokens=2048, min_chunk=32)
    assert pacer.cap(decoding=False) is None  # nothing to stall
    assert pacer.cap(decoding=True) == 32  # nothing measured yet: a small chunk first
    pacer.record(0, 0.1)  # a decode step: 0.1 s
    pacer.record(100, 1.1)  # 100 prefill tokens beside it: 0.01 s a token beyond the decode
    assert pacer.base_s == pytest.approx(0.1) and pacer.per_token_s == pytest.approx(0.01)
    assert pacer.cap(decoding=True) == 40  # (0.5 - 0.1) / 0.01
    pacer.record(40, 0.1 + 40 * 0.002)  # steps got cheaper (a smaller context, a freed core)
    cap = pacer.cap(decoding=True)
    assert cap is not None and 40 < cap <= 2048
    slow = StepPacer(target_s=0.5, max_tokens=2048, min_chunk=32, base_s=0.6, per_token_s=0.01)
    assert slow.cap(decoding=True) == 32  # the decode rows alone exceed the target
    fast = StepPacer(target_s=0.5, max_tokens=2048, base_s=0.0, per_token_s=1e-9)
    assert fast.cap(decoding=True) == 2048
    assert StepPacer(target_s=0.0, max_tokens=2048).cap(decoding=True) is None  # off


def test_a_negative_or_nan_target_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="step_time_target_s must be >= 0"):
        EngineConfig(step_time_target_s=-1.0)
    with pytest.raises(InvalidRequestError, match="step_time_target_s must be a finite"):
        EngineConfig(step_time_target_s=float("nan"))


@pytest.mark.model
def test_a_long_prompt_beside_a_stream_advances_in_capped_chunks(smollm) -> None:  # type: ignore[no-untyped-def]
    # A target no step meets: every prefill step beside the stream takes the 32-token minimum.
    engine = Engine(EngineConfig(model="default", device="cpu", step_time_target_s=1e-6,
                                 adaptive_batch=False), loaded=smollm)
    greedy = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    engine.add_request("stream", "Count from one to fifty:", greedy)
    for _ in range(100):  # the stream's prompt: one step on the embedded model
        if any(o.request_id == "stream" and o.token_ids for o in engine.step()):
            break
    else:
        pytest.fail("the stream produced no token")
    long_prompt = list(range(1000, 1400))  # 400 tokens
    engine.add_request("long", long_prompt, SamplingParams(max_tokens=2, temperature=0))
    chunks, streamed = [], 0
    for _ in range(len(long_prompt)):  # at least one prompt token a step, or it is stuck
        long_req = next((r for r in engine.scheduler.running if r.request_id == "long"), None)
        if long_req is not None and long_req.num_computed >= len(long_prompt):
            break
        before = long_req.num_computed if long_req is not None else 0
        outs = engine.step()
        after = next(r for r in engine.scheduler.running if r.request_id == "long").num_computed
        chunks.append(after - before)
        streamed += sum(1 for o in outs if o.request_id == "stream")
    else:
        pytest.fail(f"the long prompt did not finish its prefill: {chunks}")
    assert chunks and max(chunks) == 32 and sum(chunks) == len(long_prompt), chunks
    assert streamed == len(chunks)  # the stream advanced in every step of the prefill
    while engine.has_unfinished():
        engine.step()


@pytest.mark.model
def test_with_nothing_decoding_a_prompt_takes_the_whole_budget(smollm) -> None:  # type: ignore[no-untyped-def]
    engine = Engine(EngineConfig(model="default", device="cpu", step_time_target_s=1e-6,
                                 max_batch_tokens=256), loaded=smollm)
    engine.add_request("long", list(range(1000, 1400)), SamplingParams(max_tokens=1))
    engine.step()
    req = next(r for r in engine.scheduler.running if r.request_id == "long")
    assert req.num_computed == 256
    while engine.has_unfinished():
        engine.step()
