"""What the engine refuses before queueing a request (the API layer checks the same earlier;
these are the engine's own guarantees for in-process callers).

NOTE: token ids have one bound, the model's ``vocab_size`` (``ModelConfig.vocab_size``, the
width of its embedding and logits; :attr:`Engine.vocab_size`), on every path: prompts given as
ids, ``logit_bias`` keys, ``/detokenize`` (:func:`check_token_ids`, called by the protocol layer
and the server too). Not ``len(tokenizer)``: the grammar layer refuses a tokenizer larger than
``vocab_size`` (``VocabInfo``), and where it is smaller (padding rows, e.g. Qwen2's 151,665
tokens for 151,936 rows) the ids between the two are rows the model embeds and may sample, so a
reply's own ids can be sent back as a prompt and biased like any other; they decode to no text.
"""

from __future__ import annotations

from collections.abc import Collection

from grammarserve.errors import ErrorKind, InvalidRequestError
from grammarserve.sampling_params import SamplingParams


def check_token_ids(ids: Collection[int], *, vocab_size: int, param: str) -> None:
    """Every id of ``ids`` (the request's ``param``) must be a row of the model's logits,
    ``[0, vocab_size)``."""
    if ids and (min(ids) < 0 or max(ids) >= vocab_size):
        bad = next(t for t in ids if not 0 <= t < vocab_size)
        raise InvalidRequestError(f"{param} token ids must be in [0, {vocab_size}) (the "
                                  f"model's vocab_size), got {bad}", param=param)


def check_prompt(ids: list[int], *, vocab_size: int, max_model_len: int) -> None:
    """A prompt must be non-empty, of known token ids, and leave room for one token."""
    if not ids:
        raise InvalidRequestError("the prompt is empty", param="prompt")
    check_token_ids(ids, vocab_size=vocab_size, param="prompt")
    if len(ids) >= max_model_len:
        raise InvalidRequestError(
            f"the prompt has {len(ids)} tokens; the limit is {max_model_len - 1} "
            f"(model context and KV pool size)", param="prompt",
            kind=ErrorKind.PROMPT_TOO_LONG)


def check_bias(params: SamplingParams, *, vocab_size: int) -> None:
    """``logit_bias`` may only name token ids of the vocabulary."""
    if params.logit_bias:
        check_token_ids(params.logit_bias.keys(), vocab_size=vocab_size, param="logit_bias")
