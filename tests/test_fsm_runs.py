"""The digit-run bound (``runs.py``) on a synthetic vocabulary: ``permits`` (forced tokens)
agrees with the masks ``apply`` writes, token by token, and rollback restores the state."""

from __future__ import annotations

import numpy as np

from grammarserve.fsm.runs import RunTracker, digit_budget

VOCAB = [b"", b"1", b"12", b"1234", b".", b",", b'"', b'"12', b"\\", b"a", b"99999"]


def _allowed(tracker: RunTracker, token: int) -> bool:
    row = np.full((len(VOCAB) + 31) // 32, -1, dtype=np.int32)
    tracker.apply(row)
    return bool((int(row[token // 32]) >> (token % 32)) & 1)


def test_permits_agrees_with_the_masks() -> None:
    budget = digit_budget(VOCAB, len(VOCAB), limit=6)
    sequences = [[3, 2, 1, 1], [3, 4, 3], [6, 3, 3, 6, 5, 10, 10], [7, 3, 3, 6, 10, 1]]
    for seq in sequences:
        tracker = RunTracker(budget)
        expected = len(seq)
        for i, t in enumerate(seq):
            if not _allowed(tracker, t):
                expected = i
                break
            tracker.advance(t)
        tracker.rollback(len(seq))
        assert tracker.state == (False, False, 0)
        assert tracker.permits(seq) == expected, seq
    assert RunTracker(budget).permits([3, 2, 1]) == 2  # 4 + 2 digits fit, a 7th does not
