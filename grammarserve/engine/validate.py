"""What the engine refuses before queueing a request (the API layer checks the same earlier;
these are the engine's own guarantees for in-process callers)."""

from __future__ import annotations

from grammarserve.errors import ErrorKind, InvalidRequestError
from grammarserve.sampling_params import SamplingParams


def check_prompt(ids: list[int], *, vocab_size: int, max_model_len: int) -> None:
    """A prompt must be non-empty, of known token ids, and leave room for one token."""
    if not ids:
        raise InvalidRequestError("the prompt is empty", param="prompt")
    if any(not 0 <= t < vocab_size for t in ids):
        raise InvalidRequestError(f"prompt token ids must be in [0, {vocab_size})",
                                  param="prompt")
    if len(ids) >= max_model_len:
        raise InvalidRequestError(
            f"the prompt has {len(ids)} tokens; the limit is {max_model_len - 1} "
            f"(model context and KV pool size)", param="prompt",
            kind=ErrorKind.PROMPT_TOO_LONG)


def check_bias(params: SamplingParams, *, vocab_size: int) -> None:
    """``logit_bias`` may only name token ids of the vocabulary."""
    if params.logit_bias and any(t >= vocab_size for t in params.logit_bias):
        raise InvalidRequestError(f"logit_bias token ids must be in [0, {vocab_size})",
                                  param="logit_bias")
