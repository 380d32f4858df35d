"""BatchSizer: the running-request cap from measured decode throughput, on a simulated clock, and
the engine keeping to the cap it sets.

The simulated machine gives each decode batch size a step time; a "cliff" machine gets slower
per token past a size (as when the decode mirror stops holding every row), a plain one does
not. A batch grows and drains through the sizes, as a batch job does."""

from __future__ import annotations

import itertools

import pytest

from grammarserve.engine.batch_size import BatchSizer, bucket_max, size_bucket


class Machine:
    """Decode step seconds by rows; ``cliff``: past it every row costs 16x more."""

    def __init__(self, cliff: int | None = None) -> None:
        self.now = 0.0
        self.cliff = cliff

    def clock(self) -> float:
        return self.now

    def step_seconds(self, rows: int) -> float:
        if self.cliff is None or rows <= self.cliff:
            return 0.005 + 0.001 * rows
        return 0.005 + 0.001 * self.cliff + 0.016 * (rows - self.cliff)


def run(sizer: BatchSizer, m: Machine, rows_per_step: list[int]) -> list[int]:
    """Steps at the given sizes, each limited by the sizer's cap; returns the caps seen."""
    caps = []
    for want in rows_per_step:
        cap = sizer.limit()
        caps.append(cap)
        rows = min(want, cap)
        s = m.step_seconds(rows)
        m.now += s
        sizer.record(rows, rows, s)
    return caps


def ramp(top: int, each: int = 8) -> list[int]:
    """A batch filling up to ``top`` rows and draining again, ``each`` steps per size."""
    sizes = [1, 2, 4, 8, 16, 32, 64, 128]
    up = [n for n in sizes if n <= top]
    return [n for n in up + up[::-1] for _ in range(each)]


def test_buckets() -> None:
    assert [size_bucket(n) for n in (1, 2, 3, 4, 7, 8, 64)] == [1, 2, 2, 3, 3, 4, 7]
    assert [bucket_max(b) for b in (1, 2, 4, 7)] == [1, 3, 15, 127]


def test_more_rows_bringing_more_tokens_per_second_are_never_capped() -> None:
    m = Machine()
    sizer = BatchSizer(64, clock=m.clock)
    caps = run(sizer, m, ramp(64) * 3)
    assert set(caps) == {64} and sizer.changes == 0


def test_a_cliff_caps_at_the_best_size_and_probes_lift_it_less_often() -> None:
    m = Machine(cliff=31)
    sizer = BatchSizer(64, clock=m.clock, probe_s=2.0, max_probe_s=16.0)
    run(sizer, m, ramp(64))
    steps, probes = 0, []
    while m.now < 120.0:  # keep asking for 64 rows; every probe finds the cliff again
        before = sizer.cap
        if run(sizer, m, [64]) == [64]:
            steps += 1
            if before != 64:
                probes.append(m.now)
        else:
            assert sizer.cap == 31  # 16-31 rows give the most tokens/s; 32-63 give less
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert len(probes) >= 4 and gaps[-1] > 2 * gaps[0]
    assert all(b > a - 1e-6 for a, b in itertools.pairwise(gaps))  # the wait doubles, up to a bound
    assert steps < 0.1 * m.now / m.step_seconds(31)  # few steps paid for probing


def test_a_probe_uncaps_when_the_larger_sizes_got_faster() -> None:
    m = Machine(cliff=31)
    sizer = BatchSizer(64, clock=m.clock, probe_s=1.0)
    caps = run(sizer, m, ramp(64) + [64] * 200)
    assert caps.count(31) > 100
    m.cliff = None  # e.g. the load that slowed the large steps is gone
    caps = run(sizer, m, [64] * 400)
    assert caps[-100:] == [64] * 100 and sizer.cap == 64


def test_prefill_and_jump_forward_steps_are_not_measured() -> None:
    m = Machine(cliff=2)
    sizer = BatchSizer(64, clock=m.clock)
    for rows in [1] * 10 + [32] * 10:
        sizer.record(rows, rows * 3, m.step_seconds(rows) * 50)  # more tokens than rows
    assert sizer.cap == 64 and sizer.changes == 0


def test_stale_measurements_are_not_compared() -> None:
    m = Machine()
    sizer = BatchSizer(64, clock=m.clock, fresh_s=10.0)
    run(sizer, m, [4] * 10)
    m.now += 60.0  # then the machine got busy: the large steps take 10x as long
    for _ in range(10):
        sizer.record(32, 32, 10 * m.step_seconds(32))
    assert sizer.cap == 64


def test_disabled_records_nothing() -> None:
    m = Machine(cliff=1)
    sizer = BatchSizer(64, enabled=False, clock=m.clock)
    run(sizer, m, ramp(64))
    assert sizer.cap == 64


@pytest.mark.model
def test_the_engine_keeps_to_the_cap(smollm) -> None:  # type: ignore[no-untyped-def]
    from grammarserve import SamplingParams
    from grammarserve.config import EngineConfig
    from grammarserve.engine.engine import Engine

    config = EngineConfig(device="cpu", kv_cache_tokens=4096, max_num_reqs=8,
                          enable_prefix_cache=False)
    engine = Engine(config, loaded=smollm)
    engine.sizer.cap = 2  # as if measured: no probe is due
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    for i in range(5):
        engine.add_request(f"r{i}", [100 + i] * 12, params)
    most, finished = 0, {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.token_ids
        most = max(most, len(engine.scheduler.running))
    assert most == 2 and len(finished) == 5
    assert all(len(ids) == 6 for ids in finished.values())
    assert engine.stats().running_cap == 2
