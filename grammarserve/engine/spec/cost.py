"""How long a decode step takes for the tokens it feeds, measured: ``seconds = a + b * tokens``
fitted by exponentially weighted least squares over recent decode steps. ``b`` is what one
more draft token costs every request of the step; the step's time per row is what one
accepted draft token saves. A prior (one more token costs a quarter of a one-token step, as
measured for the embedded model on a 2-core CPU: 8 rows ~2.4x one row) stands in until drafts
have made the steps' sizes vary."""

from __future__ import annotations

import math

PRIOR_SLOPE = 0.25  # b / a before measurements say otherwise
PRIOR_WEIGHT = 4.0  # the prior counts as this many steps
DECAY = 0.97  # per observed step


class StepCost:
    """The fit of decode-step time against tokens fed."""

    def __init__(self) -> None:
        self._s = [0.0] * 5  # weighted sums: 1, x, x^2, y, x*y
        self._prior = False

    def observe(self, tokens: int, seconds: float) -> None:
        """Record one decode step (every request decoding or verifying a draft)."""
        if not self._prior:  # NOTE: the prior, scaled by the first measurement
            a = seconds / (1 + PRIOR_SLOPE * tokens)
            for x in (tokens, tokens + 8):
                self._add(x, a * (1 + PRIOR_SLOPE * x), PRIOR_WEIGHT / 2)
            self._prior = True
        self._s = [v * DECAY for v in self._s]
        self._add(tokens, seconds, 1.0)

    def _add(self, x: float, y: float, w: float) -> None:
        s = self._s
        s[0] += w
        s[1] += w * x
        s[2] += w * x * x
        s[3] += w * y
        s[4] += w * x * y

    def fit(self) -> tuple[float, float] | None:
        """``(a, b)``, or None before any step was seen."""
        n, sx, sxx, sy, sxy = self._s
        if n <= 0:
            return None
        det = n * sxx - sx * sx
        if det <= 1e-12 * max(n * sxx, 1.0):
            return sy / n, 0.0
        b = (n * sxy - sx * sy) / det
        b = max(b, 0.0)
        return (sy - b * sx) / n, b


def draft_length(alpha: float, token_value: float, token_cost: float, cap: int) -> int:
    """Draft tokens worth feeding: the i-th is accepted with probability ``alpha ** i`` and
    then saves ``token_value`` seconds, while it costs ``token_cost`` seconds either way."""
    if cap <= 0 or alpha <= 0.0 or token_value <= 0.0:
        return 0
    if token_cost <= 0.0 or alpha >= 1.0:
        return cap
    ratio = token_cost / token_value
    if ratio >= alpha:
        return 0
    return min(cap, int(math.log(ratio) / math.log(alpha)))
