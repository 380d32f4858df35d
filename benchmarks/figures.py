"""The headline figures of a constrained workload, computed one way for every benchmark.

Success is measured among *all* requests (DESIGN.md, invariant 5): a reply cut by ``max_tokens``
(finish_reason ``length``), a failed request and an invalid reply are all failures for the user.

- ``success_pct``: valid replies / all requests, in %
- ``goodput_valid_per_s``: valid replies per second of wall time
- ``valid_of_finished_pct``: valid replies / finished replies (requests that came back and were
  not cut by ``max_tokens``): the old "validity" figure, kept beside the others
- ``cut_by_length``: replies with finish_reason ``length``
- ``valid_replies``: the count behind ``success_pct``
"""

from __future__ import annotations

from typing import Any

HEADLINE = ("success_pct", "goodput_valid_per_s", "valid_of_finished_pct", "cut_by_length",
            "valid_replies")


def success_figures(requests: int, valid: int, finished: int, cut: int,
                    wall_s: float | None) -> dict[str, Any]:
    """``requests``: all requests sent; ``valid``: valid, uncut replies; ``finished``: replies
    that came back and were not cut; ``cut``: replies cut by ``max_tokens``."""
    return {
        "success_pct": round(100.0 * valid / requests, 1) if requests else None,
        "goodput_valid_per_s": round(valid / wall_s, 4) if wall_s else None,
        "valid_of_finished_pct": round(100.0 * valid / finished, 1) if finished else None,
        "cut_by_length": cut,
        "valid_replies": valid,
    }
