"""The host buffers a step's token bitmask is filled in, and its copy to the device.

Supports: one host int32 bitmask per step, filled on CPU threads (the grammar worker, while
the forward runs) and then sent to the sampler's device. On CUDA the host buffers are pinned,
so the copy is a true ``cudaMemcpyAsync`` (from pageable memory ``non_blocking=True`` is
synchronous), and there are ``depth`` of them (2 by default), rotated after each send: the
fill of step N+1 writes another buffer than the one whose copy of step N may still be in
flight. After each copy a CUDA event is recorded on the current stream; before a buffer is
written again its event is queried, and waited on only if that copy has not run yet (in a
steady step it always has: the step's token read-back came after it), so reuse never costs a
host synchronisation.

On CPU there is one buffer, no copy and no rotation: the sampler reads the host buffer itself
(and the matchers keep validating one bitmask object, as before).

Refuses: sending the buffer's last row (kept as the caller's scratch row, never copied, so it
may be written while a copy is in flight).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch


class CopyEvent(Protocol):
    """What the ring needs of a ``torch.cuda.Event`` (a stand-in in CPU tests)."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


def _cuda_event() -> CopyEvent:
    return torch.cuda.Event()


@dataclass
class RingStats:
    """How often a buffer was reused while its copy was still in flight (``waits``: the host
    blocked on the copy's event) out of ``sends``."""

    sends: int = 0
    waits: int = 0


@dataclass
class _Slot:
    host: torch.Tensor  # int32 [rows, width]; pinned on CUDA
    words: np.ndarray  # uint32 view of ``host``
    copied: CopyEvent | None = None  # recorded after this buffer's last copy


class BitmaskRing:
    """``depth`` host bitmask buffers and their sends to ``device``.

    Parameters
    ----------
    allocate : Callable[[], torch.Tensor]
        Makes one host buffer (e.g. ``GrammarCompiler.allocate_bitmask(rows)``): a contiguous
        CPU int32 ``[rows, width]`` tensor, all tokens allowed.
    device : torch.device
        Where the sampler reads the bitmask.
    pin : bool | None
        Pin the buffers (None: exactly when ``device`` is CUDA and CUDA is available).
    depth : int | None
        Buffers to rotate (None: 2 when the bitmask is copied to another device, else 1).
    new_event : Callable[[], CopyEvent] | None
        Makes the event recorded after a copy (None: ``torch.cuda.Event`` on CUDA, no events
        otherwise). CPU tests pass a stand-in to check the reuse rule.
    """

    def __init__(self, allocate: Callable[[], torch.Tensor], device: torch.device, *,
                 pin: bool | None = None, depth: int | None = None,
                 new_event: Callable[[], CopyEvent] | None = None) -> None:
        copies = device.type != "cpu"
        if pin is None:
            pin = device.type == "cuda" and torch.cuda.is_available()
        if depth is None:
            depth = 2 if copies else 1
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        if new_event is None and device.type == "cuda":
            new_event = _cuda_event
        self.device = device
        self.pinned = pin
        self._new_event = new_event
        self._copies = copies
        self._slots: list[_Slot] = []
        for _ in range(depth):
            host = allocate()
            if pin:
                host = host.pin_memory()
            self._slots.append(_Slot(host, host.numpy().view(np.uint32)))
        self._at = 0
        self.stats = RingStats()

    @property
    def depth(self) -> int:
        return len(self._slots)

    @property
    def current(self) -> torch.Tensor:
        """The buffer the step being built fills (safe to write: its last copy has run)."""
        return self._slots[self._at].host

    @property
    def words(self) -> np.ndarray:
        """``current`` as uint32 words (for reading single bits)."""
        return self._slots[self._at].words

    def send(self, rows: int) -> torch.Tensor:
        """The first ``rows`` rows of ``current`` on ``device``; then the next buffer becomes
        ``current``. On CPU the host rows themselves (no copy, one buffer). Elsewhere an
        asynchronous copy (pinned) on the current stream, followed by a recorded event; the
        returned tensor is valid on that stream. Before this returns, the new ``current``'s
        own earlier copy has run (waited on only if it had not: ``stats.waits``)."""
        slot = self._slots[self._at]
        if not 0 < rows < slot.host.shape[0]:
            raise ValueError(f"send 1..{slot.host.shape[0] - 1} rows (the last one is scratch "
                             f"space), got {rows}")
        self.stats.sends += 1
        if not self._copies:
            return slot.host[:rows]
        out = slot.host[:rows].to(self.device, non_blocking=self.pinned)
        if self._new_event is not None:
            if slot.copied is None:
                slot.copied = self._new_event()
            slot.copied.record()
        self._at = (self._at + 1) % len(self._slots)
        self._ready(self._slots[self._at])
        return out

    def _ready(self, slot: _Slot) -> None:
        """Block until ``slot``'s last copy has run, only if it has not (a query is no sync)."""
        # NOTE: with depth 2 this copy was issued a whole step ago, before that step's token
        # read-back, so the query is true and nothing waits.
        if slot.copied is not None and not slot.copied.query():
            self.stats.waits += 1
            slot.copied.synchronize()
