"""Prefill chunks sized so that a step stays short while requests decode or wait to start.

A long prompt is prefilled in chunks of up to ``max_batch_tokens`` tokens, one chunk a step,
and every request decoding beside it waits for that step: at a 1.7B shape on 2 CPU cores a
2,048-token chunk is a step of more than 10 s, so the streams beside it stalled for 10 s a token.
:class:`StepPacer` caps a step's prefill tokens (chunks and newly admitted prompts together) by
the measured cost of recent steps:

    step seconds ~ base_s + per_token_s * prefill_tokens

``base_s`` is the median of the last :data:`BASE_WINDOW` steps without prefill (the decode
rows alone; a median, since a stall of a few seconds among them, another process taking the
cores, made a running mean, and with it every step's allowance, ten times too large until the
prompt ended: benchmarks/bench_itl_long_prompt.py steps of ~450 ms beside 16 ms decode steps)
and ``per_token_s`` the running mean of recent prefill steps' time per prefill token beyond
``base_s``.

* While any request decodes, a step may take ``min(target_s, DECODE_STRETCH * base_s)``: the
  streams' inter-token latency stays within about ``DECODE_STRETCH`` times their median step
  without the prefill. Measured (benchmarks/peers/results-2026-12-08-itl.jsonl, embedded
  model, 8,000-token prompt, 4 streams, 2 cores): 2 gave an ITL p99 3.3x the p99 alone and
  the prompt's first token in 129 s; 4 gave 5.5x and 74 s (the pacer off: 20 s, and 51x).
* While nothing decodes but a request waits to be admitted, a step may take ``target_s``, so
  that the newcomer starts behind a short chunk, not a whole ``max_batch_tokens`` one (the
  scheduler also keeps part of the budget for admissions then, ``Scheduler.schedule``).
* Otherwise there is no cap (no one to stall: the largest chunk is the fastest prefill).

Before the first prefill step is measured the cap is ``min_chunk``; it never falls below
``min_chunk``, so a prompt always advances. 8: a long prompt's chunk attends apart from the
decode rows on its own contiguous K/V (``attention/prefill_kv.py``), so a short chunk no longer
makes the decode rows' step slow (the floor was 32 while it rode in their mirrored group, where
each step past the mirror's budget took seconds); below ~8 queries a chunk's attention costs
about as much as 8 (it reads the whole prefix's K/V either way) and the prompt advances slower.
Costs that rise (a chunk's attention grows with the tokens before it) are followed faster than
costs that fall, so an under-estimate lasts few steps. Decode rows are always scheduled first
(``Scheduler.schedule``).
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

#: Weight of the newest step in the running means; ``ALPHA_UP`` where the cost rose.
ALPHA = 0.3
ALPHA_UP = 0.6
#: While requests decode, a step with prefill may take this many times a decode-only step.
DECODE_STRETCH = 2.0
#: ``base_s`` is the median of this many recent steps without prefill.
BASE_WINDOW = 15


def _mean(old: float | None, new: float, alpha: float = ALPHA) -> float:
    return new if old is None else old + alpha * (new - old)


@dataclass
class StepPacer:
    """See the module docstring. ``target_s`` 0 turns the cap off."""

    target_s: float
    max_tokens: int
    min_chunk: int = 8
    base_s: float | None = None
    per_token_s: float | None = None
    decode_steps: deque[float] = field(default_factory=lambda: deque(maxlen=BASE_WINDOW))

    def limit_s(self, decoding: bool) -> float:
        """The time a step with prefill may take: ``target_s``, and while requests decode at
        most ``DECODE_STRETCH`` times the median recent decode-only step."""
        if decoding and self.base_s is not None:
            return min(self.target_s, DECODE_STRETCH * self.base_s)
        return self.target_s

    def cap(self, decoding: bool, waiting: bool = False) -> int | None:
        """The most prefill tokens the next step may take (None: no cap), ``decoding`` saying
        whether any running request is past its prompt, ``waiting`` whether a request waits
        to be admitted."""
        if self.target_s <= 0 or not (decoding or waiting):
            return None
        if self.per_token_s is None:
            return self.min_chunk
        room = self.limit_s(decoding) - ((self.base_s or 0.0) if decoding else 0.0)
        fits = int(room / self.per_token_s) if self.per_token_s > 0 else self.max_tokens
        return max(self.min_chunk, min(self.max_tokens, fits))

    def record(self, prefill_tokens: int, seconds: float) -> None:
        """Account one step that fed ``prefill_tokens`` prompt tokens and took ``seconds``."""
        if prefill_tokens == 0:
            self.decode_steps.append(seconds)
            self.base_s = statistics.median(self.decode_steps)
        else:
            beyond = max(seconds - (self.base_s or 0.0), 0.0) / prefill_tokens
            up = self.per_token_s is not None and beyond > self.per_token_s
            self.per_token_s = _mean(self.per_token_s, beyond, ALPHA_UP if up else ALPHA)

    @contextmanager
    def step(self, prefill_tokens: int) -> Iterator[None]:
        """Time the body (one forward and its sampling) and :meth:`record` it."""
        t0 = time.perf_counter()
        yield
        self.record(prefill_tokens, time.perf_counter() - t0)
