"""The deadline of the compile running on this thread: set by the compile cache around each
compile (``cache.py``), read by work that can stop at it (``backends/ll_probe.py``), so a compile
the cache has already failed at its timeout does not start a probe with a fresh one."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_DEADLINE: ContextVar[float | None] = ContextVar("grammarserve_compile_deadline", default=None)


@contextmanager
def compiling_until(deadline: float) -> Iterator[None]:
    """Run the block as a compile due at ``deadline`` (``time.monotonic()``; inf: none)."""
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def time_left(default: float) -> float:
    """Seconds left to this thread's compile (``default`` outside a cache compile; 0 past
    its deadline)."""
    deadline = _DEADLINE.get()
    if deadline is None or deadline == float("inf"):
        return default
    return max(0.0, deadline - time.monotonic())
