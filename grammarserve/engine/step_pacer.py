"""Prefill chunks sized so that a step stays near a target time while requests decode.

A long prompt is prefilled in chunks of up to ``max_batch_tokens`` tokens, one chunk a step,
and every request decoding beside it waits for that step: at a 1.7B shape on 2 CPU cores a
2,048-token chunk is a step of more than 10 s, so the streams beside it stalled for 10 s a token.
While any request decodes, :class:`StepPacer` caps a step's prefill tokens (chunks and newly
admitted prompts together) at what fits ``target_s`` by the measured cost of recent steps:

    step seconds ~ base_s + per_token_s * prefill_tokens

``base_s`` is the running mean of recent steps without prefill (the decode rows alone) and
``per_token_s`` that of recent prefill steps' time per prefill token beyond ``base_s``. Before the
first prefill step is measured the cap is ``min_chunk``. The cap never falls below ``min_chunk``,
so a prompt always advances, and it is lifted when nothing decodes (no stream to stall: the
largest chunk is the fastest prefill). Decode rows are always scheduled first
(``Scheduler.schedule``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

#: Weight of the newest step in the running means.
ALPHA = 0.3


def _mean(old: float | None, new: float) -> float:
    return new if old is None else old + ALPHA * (new - old)


@dataclass
class StepPacer:
    """See the module docstring. ``target_s`` 0 turns the cap off."""

    target_s: float
    max_tokens: int
    min_chunk: int = 32
    base_s: float | None = None
    per_token_s: float | None = None

    def cap(self, decoding: bool) -> int | None:
        """The most prefill tokens the next step may take (None: no cap), ``decoding`` saying
        whether any running request is past its prompt."""
        if self.target_s <= 0 or not decoding:
            return None
        if self.per_token_s is None:
            return self.min_chunk
        room = self.target_s - (self.base_s or 0.0)
        fits = int(room / self.per_token_s) if self.per_token_s > 0 else self.max_tokens
        return max(self.min_chunk, min(self.max_tokens, fits))

    def record(self, prefill_tokens: int, seconds: float) -> None:
        """Account one step that fed ``prefill_tokens`` prompt tokens and took ``seconds``."""
        if prefill_tokens == 0:
            self.base_s = _mean(self.base_s, seconds)
        else:
            beyond = max(seconds - (self.base_s or 0.0), 0.0)
            self.per_token_s = _mean(self.per_token_s, beyond / prefill_tokens)

    @contextmanager
    def step(self, prefill_tokens: int) -> Iterator[None]:
        """Time the body (one forward and its sampling) and :meth:`record` it."""
        t0 = time.perf_counter()
        yield
        self.record(prefill_tokens, time.perf_counter() - t0)
