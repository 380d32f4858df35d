"""The deadline of the compile running on this thread: set by the compile cache around each
compile (``cache.py``) and moved to now when every request waiting for the compile has left
(``GrammarCache.abandon``); read by work that can stop at it (``backends/ll_probe.py``), so a
compile the cache has failed at its timeout, or that nobody waits for, stops its probe."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass
class Deadline:
    """When a compile is due (``time.monotonic()``; inf: never). Mutable: ``at`` moves to
    ``-inf`` when the compile is abandoned."""

    at: float

    def left(self) -> float:
        """Seconds left (0 past it)."""
        return max(0.0, self.at - time.monotonic())


_CURRENT: ContextVar[Deadline | None] = ContextVar("grammarserve_compile_deadline",
                                                   default=None)


@contextmanager
def compiling_until(deadline: Deadline) -> Iterator[None]:
    """Run the block as a compile due at ``deadline``."""
    token = _CURRENT.set(deadline)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current(default_s: float) -> Deadline:
    """This thread's compile deadline; outside a cache compile, or without one (inf),
    ``default_s`` from now."""
    deadline = _CURRENT.get()
    if deadline is None or deadline.at == float("inf"):
        return Deadline(time.monotonic() + default_s)
    return deadline
