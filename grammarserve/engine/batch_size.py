"""How many requests run at once, decided from the decode steps' own measured throughput.

"Everything at once" is right while a decode step's cost grows slower than its rows (on the
embedded model: 157 / 399 / 511 / 660 tokens/s at 1 / 8 / 32 / 64 rows, ``bench_roofline.py``).
It is wrong where more rows cost more than they bring: a decode mirror or a cache that no longer
holds every row, rows whose K/V outweigh the shared weights, a machine with less bandwidth.
:class:`BatchSizer` measures instead of assuming.

Policy: keep a tokens/s average per decode batch size, bucketed by powers of two, from pure
decode steps (every row decoding one token; prefill and jump-forward steps cost differently and
are left out). Once a bucket and a smaller one both have enough recent samples (a batch grows and
drains through the sizes, so they are measured under the same load), and the larger one gives
under ``margin`` of the best smaller bucket's tokens/s, cap the running requests at the best
bucket's largest size; waiting requests then enter as rows finish. While capped, lift the cap
now and then (``probe_s``, doubling up to ``max_probe_s`` while the cap holds) so the larger sizes
are measured again: load that came and went must not pin the cap.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


def size_bucket(rows: int) -> int:
    """Bucket of a decode batch of ``rows`` rows: 1, 2-3, 4-7, 8-15, ... (``rows.bit_length()``)."""
    return rows.bit_length()


def bucket_max(bucket: int) -> int:
    """The largest batch size in ``bucket``."""
    return (1 << bucket) - 1


@dataclass
class BatchSizer:
    """Caps the requests that run at once at the decode batch size that gives the most tokens/s
    here (see the module docstring). ``record(rows, tokens, seconds)`` after each step;
    ``cap`` is the running-request limit for the next one (``max_rows`` when uncapped)."""

    max_rows: int
    enabled: bool = True
    margin: float = 0.85  # a larger size that gives under this share of a smaller one's tokens/s
    min_samples: int = 6  # steps per bucket before its average counts
    alpha: float = 0.2  # weight of a new step in its bucket's average
    fresh_s: float = 20.0  # only averages updated this recently are compared (same conditions)
    probe_s: float = 30.0
    max_probe_s: float = 480.0
    clock: Callable[[], float] = time.monotonic
    cap: int = 0
    changes: int = 0  # times the cap moved (a counter for /metrics and tests)
    _rate: dict[int, tuple[float, int, float]] = field(default_factory=dict)  # tokens/s,
    # samples, when last updated
    _wait: float = 0.0
    _probe_at: float | None = None  # while capped: when the cap is lifted to measure again
    _probing: int = 0  # while a probe runs: the cap it lifted

    def __post_init__(self) -> None:
        self.cap = self.max_rows
        self._wait = self.probe_s

    def record(self, rows: int, tokens: int, seconds: float) -> None:
        """A step of ``rows`` requests feeding ``tokens`` tokens took ``seconds``."""
        if not self.enabled or rows == 0 or tokens != rows or seconds <= 0:
            return
        b = size_bucket(rows)
        rate, n, _ = self._rate.get(b, (0.0, 0, 0.0))
        now = rows / seconds
        self._rate[b] = (now if n == 0 else rate + self.alpha * (now - rate), n + 1, self.clock())
        self._decide()

    def _ready(self) -> dict[int, float]:
        oldest = self.clock() - self.fresh_s
        return {b: r for b, (r, n, t) in self._rate.items() if n >= self.min_samples and t >= oldest}

    def _decide(self) -> None:
        rates = self._ready()
        held = self._probing
        if held:
            if not any(b > size_bucket(held) for b in rates):
                return  # the sizes above the lifted cap are not measured yet
            self._probing = 0
        elif self.cap < self.max_rows:
            return  # capped: only a probe revisits the decision
        worse = self._worse_bucket(rates)
        if worse is None:
            self._set(self.max_rows)
            self._probe_at, self._wait = None, self.probe_s
            return
        best = max((b for b in rates if b < worse), key=lambda b: rates[b])
        cap = min(bucket_max(best), self.max_rows)
        # NOTE: a probe that finds the same cap doubles the wait before the next one
        self._wait = min(2 * self._wait, self.max_probe_s) if cap == held else self.probe_s
        self.cap = held or self.cap  # (a probe lifted it; not a change of its own)
        self._set(cap)
        self._probe_at = self.clock() + self._wait

    def _worse_bucket(self, rates: dict[int, float]) -> int | None:
        """The smallest measured bucket giving under ``margin`` of a smaller bucket's tokens/s."""
        best = 0.0
        for b in sorted(rates):
            if best and rates[b] < self.margin * best:
                return b
            best = max(best, rates[b])
        return None

    def _set(self, cap: int) -> None:
        if cap != self.cap:
            self.cap, self.changes = cap, self.changes + 1

    def limit(self) -> int:
        """The running-request limit for the next step (lifts the cap when a probe is due)."""
        if (self._probe_at is not None and not self._probing
                and self.clock() >= self._probe_at and self.cap < self.max_rows):
            self._probing = self.cap
            for b in [b for b in self._rate if b > size_bucket(self.cap)]:
                del self._rate[b]  # measure the larger sizes afresh
            self.cap = self.max_rows
        return self.cap

    @contextmanager
    def step(self, rows: int, tokens: int) -> Iterator[None]:
        """Time the body (one forward and its sampling) and :meth:`record` it."""
        t0 = time.perf_counter()
        yield
        self.record(rows, tokens, time.perf_counter() - t0)
