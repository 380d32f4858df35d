"""Shared masks for the free text before a trigger (tool calls with ``tool_choice="auto"``).

Before the trigger ``<tool_call>`` appears, the ``auto`` grammar (see ``tools.py``) accepts any
text, and its mask depends on two things only: how much of the trigger the text ends with (a
KMP state, 0..len-1) and the incomplete UTF-8 sequence at its end, if any. llguidance computes
each such mask from scratch in every matcher (0.5-1 ms: a walk of the whole token trie), so the
matchers of one grammar share them here, keyed by that state; a hit costs a copy (~1 us).
Once the trigger has appeared the state becomes ``None`` and masks come from the backend again.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from grammarserve.fsm.kmp import Kmp

#: The state of free text: (trigger bytes matched at its end, incomplete UTF-8 tail).
TextState = tuple[int, bytes]


class FreeTextMasks:
    """Masks of the free-text states of one compiled grammar, and how tokens move between
    states. Thread-safe for concurrent readers and writers (writes are single dict stores)."""

    #: Enough for every trigger prefix times a few UTF-8 tails.
    MAX_ENTRIES = 64

    def __init__(self, trigger: bytes, token_bytes: Sequence[bytes]) -> None:
        self.trigger = trigger
        self.token_bytes = token_bytes
        self.masks: dict[TextState, np.ndarray] = {}
        self._kmp = Kmp(trigger)

    def advance(self, state: TextState | None, token_id: int) -> TextState | None:
        """The state after ``token_id``; ``None`` once the trigger has appeared."""
        if state is None:
            return None
        k, tail = state
        data = self.token_bytes[token_id]
        k, found = self._kmp.step(k, data)
        return None if found is not None else (k, _utf8_tail(tail + data))

    def put(self, state: TextState, row: np.ndarray) -> None:
        """Keep a copy of the mask ``row`` of ``state`` (if there is room)."""
        if len(self.masks) < self.MAX_ENTRIES:
            self.masks[state] = row.copy()

    @property
    def nbytes(self) -> int:
        """Memory held by the kept masks."""
        return sum(m.nbytes for m in list(self.masks.values()))


def _utf8_tail(data: bytes) -> bytes:
    """The incomplete UTF-8 sequence at the end of ``data`` (empty if it ends complete)."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b < 0x80:
            return b""
        if b >= 0xC0:  # a lead byte: complete if its sequence fits in what follows
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return data[-back:] if back < need else b""
    return b""
