"""How long a decode step takes for what it feeds, measured: ``seconds = a + b * tokens + c *
attention`` (attention: queries times the keys they attend to) fitted by exponentially
weighted least squares over recent decode steps. ``b + c * context`` is what one more draft
token of a request at that context length costs every request of the step (the attention of
a draft over a long prompt is most of it on CPU); the step's time per row is what one
accepted draft token saves. A prior (one more token costs a quarter of a one-token step, as
measured for the embedded model on a 2-core CPU: 8 rows ~2.4x one row; 1,000 more keys for a
query about an eighth) stands in until drafts have made the steps' sizes vary."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PRIOR_SLOPE = 0.25  # b / a before measurements say otherwise
PRIOR_ATTENTION = 0.12  # c / a per 1,000 (query x key) pairs per head group, likewise
PRIOR_WEIGHT = 4.0  # the prior counts as this many steps
DECAY = 0.97  # per observed step
RIDGE = 1e-3  # keeps the fit solvable while the steps' sizes do not vary


@dataclass(frozen=True)
class Fit:
    """Seconds of a decode step: ``a + b * tokens + c * attention`` (``attention``: the
    step's queries times the keys each attends to, in thousands)."""

    a: float
    b: float
    c: float

    def step(self, tokens: int, attention: float) -> float:
        return self.a + self.b * tokens + self.c * attention

    def marginal(self, context: int) -> float:
        """What one more token fed at position ``context`` adds to the step."""
        return self.b + self.c * context / 1000


class StepCost:
    """The fit of decode-step time against tokens fed and attention work."""

    def __init__(self) -> None:
        self._xx = np.zeros((3, 3))
        self._xy = np.zeros(3)
        self._seen = False

    def observe(self, tokens: int, attention: float, seconds: float) -> None:
        """Record one decode step (every request decoding or verifying a draft)."""
        if not self._seen:  # NOTE: the prior, scaled by the first measurement
            a = seconds / (1 + PRIOR_SLOPE * tokens + PRIOR_ATTENTION * attention)
            for x in ((1.0, tokens, attention), (1.0, tokens + 8, attention),
                      (1.0, tokens, attention + 8)):
                y = a * (1 + PRIOR_SLOPE * x[1] + PRIOR_ATTENTION * x[2])
                self._add(np.array(x), y, PRIOR_WEIGHT / 3)
            self._seen = True
        self._xx *= DECAY
        self._xy *= DECAY
        self._add(np.array((1.0, tokens, attention)), seconds, 1.0)

    def _add(self, x: np.ndarray, y: float, w: float) -> None:
        self._xx += w * np.outer(x, x)
        self._xy += w * y * x

    def fit(self) -> Fit | None:
        """The current fit (``b``, ``c`` at least 0; the prior's proportions while the fit
        has no positive intercept), or None before any step was seen."""
        if not self._seen:
            return None
        ridge = RIDGE * np.diag(np.diag(self._xx))  # NOTE: per feature, scale-free
        a, b, c = np.linalg.solve(self._xx + ridge, self._xy)
        if a <= 0:
            mean = self._xy[0] / self._xx[0, 0]
            return Fit(mean, PRIOR_SLOPE * mean, PRIOR_ATTENTION * mean)
        return Fit(float(a), max(float(b), 0.0), max(float(c), 0.0))


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


EXPLORE = 16  # every EXPLORE-th step of a batch size tries the mode not in use
SMOOTH = 0.1  # weight of a step in its mode's running mean


class SpecSwitch:
    """Whether drafting pays at a batch size, measured: per bucket of rows (1, 2-3, 4-7, ...),
    the running mean of a step's seconds per output token with drafts fed and without; drafts
    are on where that is lower, and every ``EXPLORE``-th step of the bucket runs the other
    way so both stay measured (a bucket starts with drafts on)."""

    def __init__(self) -> None:
        self._cost: dict[tuple[int, bool], float] = {}
        self._seen: dict[tuple[int, bool], int] = {}  # steps recorded per (bucket, mode)
        self._steps: dict[int, int] = {}

    @staticmethod
    def _bucket(rows: int) -> int:
        return max(rows, 1).bit_length()

    def enabled(self, rows: int) -> bool:
        """Whether this step may draft (advances the bucket's step count)."""
        b = self._bucket(rows)
        n = self._steps[b] = self._steps.get(b, 0) + 1
        on, off = self._cost.get((b, True)), self._cost.get((b, False))
        best = True if on is None or off is None else on <= off
        if off is None and n > 1:
            best = n % 2 == 1  # NOTE: measure plain steps early too
        return best != (n % EXPLORE == 0)

    def record(self, rows: int, drafted: bool, seconds: float, tokens: int) -> None:
        """A decode step of ``rows`` requests that appended ``tokens`` output tokens."""
        if tokens <= 0:
            return
        key = (self._bucket(rows), drafted)
        per = seconds / tokens
        n = self._seen[key] = self._seen.get(key, 0) + 1
        old = self._cost.get(key, per)
        # NOTE: the plain mean while a mode has few steps: one unlucky first step (a draft
        # of nothing but misses) would otherwise hold drafts off for a hundred steps
        self._cost[key] = old + max(1.0 / n, SMOOTH) * (per - old)
