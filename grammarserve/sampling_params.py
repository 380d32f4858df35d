"""Per-request generation parameters."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from grammarserve.constraints import Constraint, ReasoningSpan
from grammarserve.errors import InvalidRequestError

#: The accepted range of ``repetition_penalty``.
MIN_REPETITION, MAX_REPETITION = 0.01, 100.0


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
    frequency_penalty, presence_penalty:
        OpenAI's penalties in ``[-2, 2]``: token ``t``'s logit is lowered by
        ``count(t) * frequency_penalty + (count(t) > 0) * presence_penalty``, ``count`` over
        the tokens generated so far for this request (tokens forced by jump-forward count).
    repetition_penalty:
        vLLM's penalty (an extension, in ``[0.01, 100]``, 1 = off): the logit of every token
        seen in the prompt or the output is divided by it when positive, multiplied when
        negative. (vLLM takes any value > 0; below 0.01 a logit could overflow to +inf.)
    logit_bias:
        Token id -> bias in ``[-100, 100]`` added to the logit (-100 effectively bans the
        token). Applied before the constraint's mask: a bias never re-allows a masked token.
    dry_multiplier, dry_base, dry_allowed_length:
        DRY, a penalty on tokens that would extend a repetition inside the reply
        (``grammarserve.engine.dry``; an extension, as in llama.cpp): ``multiplier`` in
        ``[0, 100]`` (0: off; None: the engine's default, ``EngineConfig.dry_multiplier`` for
        constrained requests, off otherwise), ``base`` in ``[1, 10]``, ``allowed_length`` >= 1
        (repeats up to this many tokens are free).
    reasoning:
        The reply starts with this free-text reasoning span; ``constraint`` applies after it
        (its thinking budget forces the span closed).
    top_logprobs:
        Also return, for each generated token, this many (0..20) most likely tokens with their
        log-probabilities, under the distribution the token was drawn from; only tokens the
        constraint allows are listed (fewer when it allows fewer).
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
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Mapping[int, float] | None = None
    top_logprobs: int = 0
    dry_multiplier: float | None = None
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    reasoning: ReasoningSpan | None = None

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
        if self.reasoning is not None and not isinstance(self.reasoning, ReasoningSpan):
            raise InvalidRequestError("reasoning must be a grammarserve.constraints.ReasoningSpan",
                                      param="reasoning")
        self._check_controls()

    def _check_controls(self) -> None:
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2.0 <= value <= 2.0:
                raise InvalidRequestError(f"{name} must be a number in [-2, 2], got {value!r}",
                                          param=name)
        rep = self.repetition_penalty
        if not _is_number(rep) or not MIN_REPETITION <= rep <= MAX_REPETITION:
            raise InvalidRequestError(f"repetition_penalty must be in [{MIN_REPETITION}, "
                                      f"{MAX_REPETITION}] (1 = off), got {rep!r}",
                                      param="repetition_penalty")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, Mapping):
                raise InvalidRequestError("logit_bias must map token ids to biases",
                                          param="logit_bias")
            for tok, bias in self.logit_bias.items():
                if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
                    raise InvalidRequestError(f"logit_bias keys must be token ids (integers >= "
                                              f"0), got {tok!r}", param="logit_bias")
                if not _is_number(bias) or not -100.0 <= bias <= 100.0:
                    raise InvalidRequestError(f"logit_bias values must be in [-100, 100], got "
                                              f"{bias!r} for token {tok}", param="logit_bias")
        dry = self.dry_multiplier
        if dry is not None and (not _is_number(dry) or not 0.0 <= dry <= 100.0):
            raise InvalidRequestError(f"dry_multiplier must be a number in [0, 100], got {dry!r}",
                                      param="dry_multiplier")
        if not _is_number(self.dry_base) or not 1.0 <= self.dry_base <= 10.0:
            raise InvalidRequestError(f"dry_base must be a number in [1, 10], got "
                                      f"{self.dry_base!r}", param="dry_base")
        length = self.dry_allowed_length
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise InvalidRequestError(f"dry_allowed_length must be an integer >= 1, got "
                                      f"{length!r}", param="dry_allowed_length")
        top = self.top_logprobs
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
            raise InvalidRequestError(f"top_logprobs must be an integer in [0, 20], got {top!r}",
                                      param="top_logprobs")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether a penalty is on (the sampler then needs the request's tokens)."""
        return (self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
                or self.repetition_penalty != 1.0)

    @property
    def uses_controls(self) -> bool:
        """Whether a penalty or a logit bias changes the logits."""
        return self.penalized or bool(self.logit_bias) or bool(self.dry_multiplier)

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
