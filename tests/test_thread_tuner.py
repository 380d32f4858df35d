"""ThreadTuner: the per-step choice between one thread and all of them, on a simulated clock.

Each scenario feeds the tuner the step times a machine would show (quiet: two threads 1.5x
faster; busy: two threads stall at barriers) and checks which choice it settles on and how
many slow trials it pays."""

from __future__ import annotations

import torch

from grammarserve.engine.threads import ThreadTuner, step_shape


class Machine:
    """Step seconds by thread count, switchable between quiet and busy; advances the clock."""

    def __init__(self) -> None:
        self.now = 0.0
        self.busy = False

    def clock(self) -> float:
        return self.now

    def step_seconds(self, threads: int, shape: tuple[int, int]) -> float:
        base = 0.010 * shape[0]  # bigger shapes cost more
        if self.busy:
            return base * (2.0 if threads == 1 else 60.0)
        return base * (1.0 if threads == 1 else 0.65)


def run(tuner: ThreadTuner, m: Machine, steps: int, shape: tuple[int, int]) -> list[int]:
    chosen = []
    for _ in range(steps):
        n = tuner.choose(shape)
        s = m.step_seconds(n, shape)
        m.now += s
        tuner.record(shape, n, s)
        chosen.append(n)
    return chosen


def test_quiet_machine_keeps_all_threads_and_trials_back_off() -> None:
    m = Machine()
    t = ThreadTuner(max_threads=2, clock=m.clock)
    chosen = run(t, m, 3000, step_shape(8, 8))
    assert t.current == 2 and t.switches == 0
    assert chosen.count(1) == t.trials
    # ~30 s of steps: trials at 1, 2, 4, 8, 16 s apart, not one per second
    assert 3 <= t.trials <= 6, t.trials


def test_busy_machine_falls_back_to_one_thread_at_the_first_slow_step() -> None:
    m = Machine()
    t = ThreadTuner(max_threads=2, clock=m.clock)
    shape = step_shape(8, 8)
    run(t, m, 200, shape)
    assert t.current == 2
    m.busy, before = True, t.trials
    chosen = run(t, m, 400, shape)
    assert t.current == 1
    assert chosen[:3] == [2, 1, 1]  # the step that saw the load, then two trials of one thread
    trials = t.trials - before
    assert chosen.count(2) == 1 + trials - 2  # that step, then the (lost) trials of two threads
    # ~60 s busy: trials of two threads back off (1, 2, 4, ... s), a handful of slow steps
    assert trials <= 7, trials


def test_recovers_all_threads_when_the_load_goes() -> None:
    m = Machine()
    m.busy = True
    t = ThreadTuner(max_threads=2, clock=m.clock)
    run(t, m, 300, step_shape(8, 8))
    assert t.current == 1
    m.busy = False
    run(t, m, 8000, step_shape(8, 8))  # ~65 s of quiet steps: past the longest backoff
    assert t.current == 2


def test_a_trial_waits_for_a_shape_with_an_average() -> None:
    m = Machine()
    t = ThreadTuner(max_threads=2, clock=m.clock, first_trial_s=0.0)
    assert t.choose(step_shape(8, 8)) == 2  # nothing known: the current choice
    for _ in range(3):  # the first step of a shape pays warm-up: an average needs three
        t.record(step_shape(8, 8), 2, 0.02)
    t.record(step_shape(64, 64), 2, 0.1)
    assert t.choose(step_shape(64, 64)) == 2  # a trial is due, but this shape has no average
    assert t.choose(step_shape(8, 8)) == 1  # the trial runs on the known shape
    t.record(step_shape(8, 8), 1, 0.001)  # won once: one more trial before switching
    assert t.current == 2 and t.choose(step_shape(8, 8)) == 1
    t.record(step_shape(8, 8), 1, 0.001)
    assert t.current == 1 and t.switches == 1


def test_one_thread_configured_means_no_trials() -> None:
    m = Machine()
    t = ThreadTuner(max_threads=1, clock=m.clock)
    assert set(run(t, m, 100, step_shape(8, 8))) == {1}
    assert t.trials == 0


def test_step_sets_torch_threads_only_when_enabled() -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with ThreadTuner(max_threads=1).step(8, 8):
            assert torch.get_num_threads() == 2  # disabled: a fixed --num-threads stays
        m = Machine()
        t = ThreadTuner(max_threads=2, clock=m.clock, first_trial_s=0.0)
        for _ in range(3):
            with t.step(8, 8):
                assert torch.get_num_threads() == 2
        with t.step(8, 8):  # the trial of one thread
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_reserved_core_caps_the_step_without_trials_or_averages() -> None:
    before = torch.get_num_threads()
    try:
        m = Machine()
        t = ThreadTuner(max_threads=4, clock=m.clock, first_trial_s=0.0)
        for _ in range(3):  # an average for the shape, and a trial due
            with t.step(8, 8):
                assert torch.get_num_threads() == 4
        for _ in range(5):  # a grammar compiling: one core for it, no trial, no average
            with t.step(8, 8, reserve=1):
                assert torch.get_num_threads() == 3
        assert t.trials == 0
        with t.step(8, 8, reserve=8):
            assert torch.get_num_threads() == 1  # at least one thread
        with t.step(8, 8):  # the trial that was due runs once the core is free again
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
