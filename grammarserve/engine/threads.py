"""How many CPU threads each forward runs on, decided from the steps' own measured times.

The CPU kernels split every matmul and attention call over OpenMP threads and wait for all of
them at the end of the call (~150 such barriers per decode step). On a machine whose cores are
busy with other work, one of our threads is often descheduled, and every barrier then waits for
a scheduler time slice: a decode step of ~20 ms took ~1.4 s with two threads beside two busy
processes on two cores, against ~40 ms on one thread (``benchmarks/bench_contention.py``). No
fixed setting is right for both a quiet and a shared machine, so :class:`ThreadTuner` measures.

Policy: run on the current choice (at first, all threads) and keep an average step time per step
shape (rows and tokens, in powers of two; a shape's first step, which pays for warm-up, is left
out). Now and then, on a step whose shape has an average, run the other choice; it takes over
when two trial steps in a row beat the average by a margin. A lost trial doubles the wait before
the next (up to ``max_backoff_s``), so a busy machine pays one slow step a minute; a step far
slower than its shape's average (load just arrived) brings the next trial forward.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

Shape = tuple[int, int]


def step_shape(rows: int, tokens: int) -> Shape:
    """Steps of one shape cost about the same: rows and tokens bucketed by powers of two."""
    return rows.bit_length(), tokens.bit_length()


@dataclass
class _Trial:
    threads: int
    shape: Shape | None = None  # set once a step of a shape with an average is chosen
    wins: int = 0


@dataclass
class ThreadTuner:
    """Chooses between one thread and ``max_threads`` per forward (see the module docstring).

    ``choose(shape)`` before a step, ``record(shape, threads, seconds)`` after it."""

    max_threads: int
    first_trial_s: float = 1.0
    max_backoff_s: float = 64.0
    margin: float = 0.85  # a trial wins when it takes under this share of the current average
    spike: float = 2.0  # a step this many times its shape's average brings a trial forward
    alpha: float = 0.3
    clock: Callable[[], float] = time.monotonic
    current: int = 0
    trials: int = 0
    switches: int = 0
    _avg: dict[Shape, tuple[float, int]] = field(default_factory=dict)  # seconds, samples
    _backoff: float = 0.0
    _next_trial: float = 0.0
    _trial: _Trial | None = None

    def __post_init__(self) -> None:
        self.current = self.current or self.max_threads
        self._backoff = self.first_trial_s
        self._next_trial = self.clock() + self.first_trial_s

    @property
    def enabled(self) -> bool:
        return self.max_threads > 1

    def choose(self, shape: Shape) -> int:
        """The thread count for the next step, of ``shape``."""
        if not self.enabled:
            return 1
        if self._trial is None and self.clock() >= self._next_trial:
            self._trial = _Trial(1 if self.current != 1 else self.max_threads)
        trial = self._trial
        if trial is not None and trial.shape is None and self._avg.get(shape, (0, 0))[1] >= 3:
            trial.shape = shape
            return trial.threads
        return self.current

    def record(self, shape: Shape, threads: int, seconds: float) -> None:
        """The step of ``shape`` just run on ``threads`` threads took ``seconds``."""
        if not self.enabled:
            return
        trial = self._trial
        if trial is not None and trial.shape == shape and threads == trial.threads:
            self.trials += 1
            if seconds < self.margin * self._avg[shape][0]:
                trial.wins += 1
                if trial.wins < 2:  # once more, to be sure it was not a lucky step
                    trial.shape = None
                    return
                self.current, self.switches = threads, self.switches + 1
                self._avg = {shape: (seconds, 3)}
                self._backoff = self.first_trial_s
            else:
                self._backoff = min(2 * self._backoff, self.max_backoff_s)
            self._trial = None
            self._next_trial = self.clock() + self._backoff
            return
        if threads != self.current:
            return
        avg, n = self._avg.get(shape, (seconds, 0))
        if n >= 3 and seconds > self.spike * avg and self._trial is None:
            self._next_trial = self.clock()  # load arrived: try the other choice now
        self._avg[shape] = (avg + self.alpha * (seconds - avg) if n >= 2 else seconds, n + 1)

    @contextmanager
    def step(self, rows: int, tokens: int, reserve: int = 0) -> Iterator[None]:
        """Run the body (one forward and its sampling) on the chosen number of torch threads (the
        C++ kernels read ``torch.get_num_threads()``) and record its time. ``reserve`` cores
        are busy with our own work meanwhile (a grammar compile): the step then runs on at
        most ``max_threads - reserve`` threads (at least one), starts no trial, and its time
        is not averaged unless that is the current choice. Disabled: the thread count is
        left as it is."""
        if not self.enabled:
            yield
            return
        shape = step_shape(rows, tokens)
        threads = (self.choose(shape) if reserve <= 0
                   else max(1, min(self.current, self.max_threads - reserve)))
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
        t0 = time.perf_counter()
        yield
        self.record(shape, threads, time.perf_counter() - t0)
