"""Appends a sampled token to a request and decides whether the request is finished.

Stop strings: text that could be the beginning of a stop string is held back (``req.held_text``)
until the next tokens show whether it is, so streamed text never contains part of a stop string.

Repeated tool calls (``req.repeat_guard``, see :mod:`grammarserve.fsm.repeats`): the text after
the last complete call is held back while it may still become a copy of an earlier call; when a
call closes that equals an earlier one, the reply ends (``stop``) right after the call before it,
so the copy is neither streamed nor returned.
"""

from __future__ import annotations

from grammarserve.engine.request import Req


def append_token(req: Req, token: int, logprob: float, *, eos_ids: frozenset[int],
                 max_model_len: int) -> None:
    """Add ``token`` to ``req``, update its text, and set ``finish_reason`` when it must stop."""
    p = req.params
    req.tokens.append(token)
    req.logprobs.append(logprob)
    if (token in eos_ids and not p.ignore_eos) or token in p.stop_token_ids:
        _finish(req, "stop", req.held_text + req.detok.flush())
        return
    new = req.detok.add([token])
    buf = req.held_text + new
    # NOTE: a constrained reply ends where its grammar ends; a stop string cutting it would
    # return invalid output as a "stop" success, so stop strings do not apply to it.
    stops = () if p.constraint is not None else p.stop_strings
    hits = [i for s in stops if (i := buf.find(s)) >= 0]
    guard = req.repeat_guard
    if guard is not None:
        cut = guard.feed(new)  # NOTE: the guard has seen req.text + buf: cut >= len(req.text)
        if cut is not None:
            hits.append(max(cut - len(req.text), 0))
    if hits:
        _finish(req, "stop", buf[:min(hits)])
        return
    keep = _stop_prefix_len(buf, stops)
    if guard is not None:
        keep = max(keep, min(guard.held, len(buf)))
    _release(req, buf[:len(buf) - keep])
    req.held_text = buf[len(buf) - keep:]
    if len(req.output_ids) >= p.max_tokens or len(req.tokens) >= max_model_len:
        _finish(req, "length", req.held_text + req.detok.flush())


def _stop_prefix_len(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


def _finish(req: Req, reason: str, text: str) -> None:
    req.held_text = ""
    _release(req, text)
    req.finish_reason = reason


def _release(req: Req, text: str) -> None:
    req.text += text
    req.pending_text += text
