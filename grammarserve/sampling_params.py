"""Per-request generation parameters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from grammarserve.constraints import Constraint
from grammarserve.errors import InvalidRequestError


@dataclass(frozen=True)
class SamplingParams:
    """How to generate one completion.

    Parameters
    ----------
    max_tokens:
        Upper bound on generated tokens (finish reason ``length`` when reached).
    temperature:
        0 means greedy; otherwise logits are divided by it before sampling.
    top_p, top_k, min_p:
        Nucleus, top-k (0 = off) and min-p filtering, applied after temperature.
    seed:
        Makes sampling reproducible for this request, whatever else is in the batch.
    stop:
        Strings that end the completion; the matched stop string is not included in the text.
        They do not apply to constrained requests, which end where their grammar ends.
    stop_token_ids:
        Extra token ids that end the completion (the model's EOS always does unless
        ``ignore_eos``).
    constraint:
        The output must match it (JSON schema, regex, grammar, choice, tool calls); the reply
        ends with ``finish_reason`` ``stop`` only when it is complete and valid.
    jump_forward:
        Feed the tokens the constraint forces (keys, punctuation, enum tails) in one forward
        instead of decoding them one by one (the engine-wide switch must be on too).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    constraint: Constraint | None = None
    jump_forward: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be an integer >= 1, got "
                                      f"{self.max_tokens!r}", param="max_tokens")
        if not 0.0 <= self.temperature <= 100.0:
            raise InvalidRequestError(f"temperature must be in [0, 100], got {self.temperature}",
                                      param="temperature")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}", param="top_p")
        if not 0 <= self.top_k <= 2**63 - 1:  # the sampler holds it in an int64 tensor
            raise InvalidRequestError(f"top_k must be in [0, 2**63 - 1] (0 = off), got "
                                      f"{self.top_k}", param="top_k")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidRequestError(f"min_p must be in [0, 1], got {self.min_p}", param="min_p")
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            raise InvalidRequestError("stop must be non-empty strings", param="stop")
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise InvalidRequestError("constraint must be a grammarserve.Constraint",
                                      param="constraint")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
