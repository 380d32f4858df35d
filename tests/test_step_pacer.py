"""Stall-free mixing (``engine/step_pacer.py``): while requests decode, a long prompt's prefill
is cut to what fits the step-time target by measured cost, decode rows first; with nothing
decoding, the whole token budget."""

from __future__ import annotations

import pytest

from grammarserve.config import EngineConfig
from grammarserve.engine.engine import Engine
from grammarserve.engine.step_pacer import ALPHA, ALPHA_UP, BASE_WINDOW, DECODE_STRETCH, StepPacer
from grammarserve.errors import InvalidRequestError
from grammarserve.sampling_params import SamplingParams


def test_the_cap_fits_the_target_by_measured_cost() -> None:
    pacer = StepPacer(target_s=0.5, max_tokens=2048, min_chunk=8)
    assert pacer.cap(decoding=False) is None  # nothing to stall
    assert pacer.cap(decoding=True) == 8  # nothing measured yet: a small chunk first
    pacer.record(0, 0.25)  # a decode step: 0.25 s
    pacer.record(100, 1.25)  # 100 prefill tokens beside it: 0.01 s a token beyond the decode
    assert pacer.base_s == pytest.approx(0.25) and pacer.per_token_s == pytest.approx(0.01)
    assert pacer.limit_s(decoding=True) == 0.5  # the target: less than twice the decode step
    assert pacer.cap(decoding=True) == 25  # (0.5 - 0.25) / 0.01
    pacer.record(25, 0.25 + 25 * 0.002)  # steps got cheaper (a smaller context, a freed core)
    cap = pacer.cap(decoding=True)
    assert cap is not None and 25 < cap <= 2048
    slow = StepPacer(target_s=0.5, max_tokens=2048, min_chunk=32, base_s=0.6, per_token_s=0.01)
    assert slow.cap(decoding=True) == 32  # the decode rows alone exceed the target
    fast = StepPacer(target_s=0.5, max_tokens=2048, base_s=0.3, per_token_s=1e-9)
    assert fast.cap(decoding=True) == 2048
    assert StepPacer(target_s=0.0, max_tokens=2048).cap(decoding=True) is None  # off


def test_beside_fast_decode_steps_a_step_stays_within_a_few_decode_steps() -> None:
    # Measured on the embedded model (benchmarks/bench_itl_long_prompt.py): a 4-row decode step
    # of ~20 ms, where a prefill token late in an 8,000-token prompt costs ~10 ms and more.
    assert DECODE_STRETCH == 2.0
    pacer = StepPacer(target_s=0.5, max_tokens=2048, min_chunk=1)
    assert pacer.cap(decoding=True) == 1
    pacer.record(0, 0.02)
    pacer.record(4, 0.02 + 4 * 0.002)  # early in the prompt: 2 ms a token
    assert pacer.limit_s(decoding=True) == pytest.approx(2 * 0.02)
    assert pacer.cap(decoding=True) == 10  # (0.04 - 0.02) / 0.002, not (0.5 - 0.02) / 0.002
    pacer.record(10, 0.02 + 10 * 0.015)  # late: 15 ms a token
    assert pacer.cap(decoding=True) == 2  # the rise is followed at once, mostly
    for _ in range(10):
        pacer.record(2, 0.02 + 2 * 0.07)
    assert pacer.cap(decoding=True) == 1  # never below min_chunk: the prompt still advances
    assert pacer.cap(decoding=False) is None


def test_a_stall_among_the_decode_steps_does_not_widen_the_allowance() -> None:
    pacer = StepPacer(target_s=0.5, max_tokens=2048, per_token_s=0.002)
    for s in [0.02] * 6 + [3.0, 2.5] + [0.02] * 3:  # another process took the cores twice
        pacer.record(0, s)
    assert pacer.base_s == pytest.approx(0.02)  # the median of the recent decode steps
    assert pacer.limit_s(decoding=True) == pytest.approx(0.04)
    for _ in range(BASE_WINDOW):
        pacer.record(0, 0.03)
    assert pacer.base_s == pytest.approx(0.03)  # a window: it follows a lasting change


def test_rising_costs_are_followed_faster_than_falling_ones() -> None:
    up = StepPacer(target_s=0.5, max_tokens=2048, base_s=0.0, per_token_s=0.01)
    up.record(10, 10 * 0.02)
    down = StepPacer(target_s=0.5, max_tokens=2048, base_s=0.0, per_token_s=0.02)
    down.record(10, 10 * 0.01)
    assert up.per_token_s == pytest.approx(0.01 + ALPHA_UP * 0.01)
    assert down.per_token_s == pytest.approx(0.02 - ALPHA * 0.01)
    assert ALPHA_UP > ALPHA


def test_a_waiting_request_caps_a_lone_prefill_at_the_target() -> None:
    pacer = StepPacer(target_s=0.5, max_tokens=2048, min_chunk=1, base_s=0.02, per_token_s=0.001)
    assert pacer.cap(decoding=False, waiting=False) is None  # a lone prompt: the whole budget
    assert pacer.limit_s(decoding=False) == 0.5  # no decode rows: the target itself
    assert pacer.cap(decoding=False, waiting=True) == 500  # 0.5 / 0.001, no decode rows
    assert pacer.cap(decoding=True, waiting=True) == 20  # (0.04 - 0.02) / 0.001
    assert StepPacer(target_s=0.0, max_tokens=2048).cap(decoding=False, waiting=True) is None


def test_a_negative_or_nan_target_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="step_time_target_s must be >= 0"):
        EngineConfig(step_time_target_s=-1.0)
    with pytest.raises(InvalidRequestError, match="step_time_target_s must be a finite"):
        EngineConfig(step_time_target_s=float("nan"))


@pytest.mark.model
def test_a_long_prompt_beside_a_stream_advances_in_capped_chunks(smollm) -> None:  # type: ignore[no-untyped-def]
    # A target no step meets: every prefill step beside the stream takes the minimum chunk.
    engine = Engine(EngineConfig(model="default", device="cpu", step_time_target_s=1e-6,
                                 adaptive_batch=False), loaded=smollm)
    greedy = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
    engine.add_request("stream", "Count from one to fifty:", greedy)
    for _ in range(100):  # the stream's prompt: one step on the embedded model
        if any(o.request_id == "stream" and o.token_ids for o in engine.step()):
            break
    else:
        pytest.fail("the stream produced no token")
    long_prompt = list(range(1000, 1048))
    engine.add_request("long", long_prompt, SamplingParams(max_tokens=2, temperature=0))
    chunks, streamed = [], 0
    for _ in range(len(long_prompt) + 1):  # at least one prompt token a step, or it is stuck
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
    assert chunks and max(chunks) == engine.pacer.min_chunk and sum(chunks) == len(long_prompt)
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


@pytest.mark.model
def test_a_newcomer_starts_beside_a_long_prompt_not_after_it(smollm) -> None:  # type: ignore[no-untyped-def]
    # Nothing decodes and the pacer does not cap: the long prompt takes the whole budget until a
    # request arrives, then half of it, and the newcomer is admitted in that same step.
    engine = Engine(EngineConfig(model="default", device="cpu", step_time_target_s=0.0,
                                 max_batch_tokens=256, adaptive_batch=False), loaded=smollm)
    engine.add_request("long", list(range(1000, 2000)), SamplingParams(max_tokens=1))
    engine.step()
    long_req = next(r for r in engine.scheduler.running if r.request_id == "long")
    assert long_req.num_computed == 256
    engine.add_request("short", list(range(3000, 3040)), SamplingParams(max_tokens=1))
    outs = engine.step()
    assert long_req.num_computed == 256 + 128
    assert [o.request_id for o in outs if o.token_ids] == ["short"]  # its first token, at once
    engine.step()
    assert long_req.num_computed == 256 + 128 + 256  # nothing waits: the whole budget again
    while engine.has_unfinished():
        engine.step()
