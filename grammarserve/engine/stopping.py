"""Appends a sampled token to a request and decides whether the request is finished."""

from __future__ import annotations

from grammarserve.engine.request import Req


def append_token(req: Req, token: int, logprob: float, *, eos_ids: frozenset[int],
                 max_model_len: int) -> None:
    """Add ``token`` to ``req``, update its text, and set ``finish_reason`` when it must stop."""
    p = req.params
    req.tokens.append(token)
    req.logprobs.append(logprob)
    if (token in eos_ids and not p.ignore_eos) or token in p.stop_token_ids:
        req.finish_reason = "stop"
        _emit(req, req.detok.flush())
        return
    new = req.detok.add([token])
    stops = p.stop_strings
    if stops and new:
        # Only the tail can contain a stop string that this token completed.
        window = max(len(s) for s in stops) + len(new)
        tail_start = max(0, len(req.text) + len(new) - window)
        candidate = req.text + new
        hits = [i for s in stops if (i := candidate.find(s, tail_start)) >= 0]
        if hits:
            _emit(req, candidate[:min(hits)][len(req.text):])
            req.finish_reason = "stop"
            return
    _emit(req, new)
    if len(req.output_ids) >= p.max_tokens or len(req.tokens) >= max_model_len:
        req.finish_reason = "length"
        _emit(req, req.detok.flush())


def _emit(req: Req, text: str) -> None:
    req.text += text
    req.pending_text += text
