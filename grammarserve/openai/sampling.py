"""An OpenAI request's sampling fields as engine :class:`SamplingParams`: the completion
budget, ``logit_bias`` as token ids, and one set of parameters per choice. Every client
mistake raises :class:`InvalidRequestError` naming the param."""

from __future__ import annotations

import re

from grammarserve.constraints import ConstraintKind
from grammarserve.engine.validate import check_token_ids
from grammarserve.errors import ErrorKind, InvalidRequestError
from grammarserve.fsm.tool_formats import tool_format
from grammarserve.openai.protocol import ChatCompletionRequest, CompletionRequest, _Generation
from grammarserve.openai.translate import ConstraintPlan
from grammarserve.sampling_params import SamplingParams


def max_new_tokens(requested: int | None, prompt_len: int, max_model_len: int,
                   where: str = "messages") -> int:
    """The completion budget; a request that cannot fit the context is refused."""
    room = max_model_len - prompt_len
    if room < 1 or (requested is not None and requested > room):
        asked = prompt_len + (requested or 1)
        raise InvalidRequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {asked} tokens ({prompt_len} in the {where}, {requested or 1} in the "
            f"completion). Please reduce the length of the {where} or completion.", param=where,
            kind=ErrorKind.PROMPT_TOO_LONG)
    return requested if requested is not None else room


def logit_bias(req: _Generation, vocab_size: int | None) -> dict[int, float] | None:
    """``logit_bias`` with its keys as token ids: each key must be the decimal id of a token of
    the model (below ``vocab_size``; not checked when None) and each bias in ``[-100, 100]``."""
    if not req.logit_bias:
        return None
    out: dict[int, float] = {}
    for key, bias in req.logit_bias.items():
        if not re.fullmatch(r"[0-9]{1,12}", key):
            raise InvalidRequestError(f"logit_bias keys must be token ids (decimal integer "
                                      f"strings), got {key!r}", param="logit_bias")
        tok = int(key)
        if vocab_size is not None:
            check_token_ids((tok,), vocab_size=vocab_size, param="logit_bias")
        if not -100.0 <= bias <= 100.0:
            raise InvalidRequestError(f"logit_bias values must be in [-100, 100], got {bias} for "
                                      f"token {key}", param="logit_bias")
        out[tok] = float(bias)
    return out


def _num_top_logprobs(req: _Generation) -> int:
    if isinstance(req, ChatCompletionRequest):
        return (req.top_logprobs or 0) if req.logprobs else 0
    if isinstance(req, CompletionRequest):
        return req.logprobs or 0
    return 0


def sampling_params(req: _Generation, *, max_tokens: int, plan: ConstraintPlan | None,
                    n: int, vocab_size: int | None = None) -> list[SamplingParams]:
    """One :class:`SamplingParams` per choice (choice ``i`` gets seed ``seed + i``).
    ``vocab_size`` bounds the token ids of ``logit_bias``."""
    temperature = 1.0 if req.temperature is None else req.temperature
    top_p = 1.0 if req.top_p is None else req.top_p
    if top_p == 0.0:
        temperature, top_p = 0.0, 1.0
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    done = (tool_format(plan.constraint.tool_format).stop
            if plan is not None and plan.constraint.kind is ConstraintKind.TOOL_CALLS else None)
    if done is not None:
        # NOTE: with grammar_max_whitespace > 0 the tool-call grammar allows whitespace after
        # the last call before the stop token, and small models fill it with newlines; a blank
        # line after a call's end tag ends the calls (the parser does not need the last tag).
        stop.append(done)
    bias = logit_bias(req, vocab_size)
    out = []
    for i in range(n):
        seed = None if req.seed is None else (req.seed + i) % 2**63
        out.append(SamplingParams(
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=req.top_k or 0,
            min_p=req.min_p or 0.0, seed=seed, stop=tuple(stop),
            ignore_eos=bool(req.ignore_eos),
            constraint=plan.constraint if plan is not None else None,
            frequency_penalty=req.frequency_penalty or 0.0,
            presence_penalty=req.presence_penalty or 0.0,
            repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
            dry_multiplier=req.dry_multiplier,
            dry_base=SamplingParams.dry_base if req.dry_base is None else req.dry_base,
            dry_allowed_length=req.dry_allowed_length or SamplingParams.dry_allowed_length,
            logit_bias=bias, top_logprobs=_num_top_logprobs(req)))
    return out
