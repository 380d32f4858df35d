"""Appends a sampled token to a request and decides whether the request is finished.

Stop strings: text that could be the beginning of a stop string is held back (``req.held_text``)
until the next tokens show whether it is, so streamed text never contains part of a stop string.

Value checks (``req.matcher.held_from()``, see :mod:`grammarserve.fsm.checked_matcher`): the text from
the first token a check may still take back is held back too, so a streamed reply never shows
text that a retry replaces.

Repeated tool calls (``req.repeat_guard``, see :mod:`grammarserve.fsm.repeats`): the text after
the last complete call is held back while it may still become a copy of an earlier call; when a
call closes that equals an earlier one, the reply ends (``stop``) right after the call before it,
so the copy is neither streamed nor returned.
"""

from __future__ import annotations

from grammarserve.engine.request import Req
from grammarserve.errors import ErrorKind


def append_token(req: Req, token: int, logprob: float, *, eos_ids: frozenset[int],
                 max_model_len: int) -> None:
    """Add ``token`` to ``req``, update its text, and set ``finish_reason`` when it must stop."""
    p = req.params
    req.tokens.append(token)
    req.logprobs.append(logprob)
    if (token in eos_ids and not p.ignore_eos) or token in p.stop_token_ids:
        _finish(req, "stop", req.held_text + req.detok.flush())
        _mark(req)
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
        _mark(req)
        return
    keep = _stop_prefix_len(buf, stops)
    if guard is not None:
        keep = max(keep, min(guard.held, len(buf)))
    keep = max(keep, _checked_len(req, len(req.text) + len(buf), len(buf)))
    _release(req, buf[:len(buf) - keep])
    req.held_text = buf[len(buf) - keep:]
    _mark(req)
    if len(req.output_ids) >= p.max_tokens or len(req.tokens) >= max_model_len:
        _finish(req, "length", req.held_text + req.detok.flush())


def _checked_len(req: Req, total: int, available: int) -> int:
    """How much of the unreleased text a value check may still take back."""
    first = req.matcher.held_from() if req.matcher is not None else None
    if first is None or first > len(req.marks):
        return 0
    start = req.marks[first - 1][0] if first > 0 else 0
    return min(max(total - start, 0), available)


def _mark(req: Req) -> None:
    if req.matcher is not None and req.matcher.retracts:
        req.marks.append((len(req.text) + len(req.held_text), req.detok.mark()))


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


def retract(req: Req, n: int) -> None:
    """Take back ``req``'s last ``n`` output tokens (a value check failed; their text was held
    back, see the module docstring): tokens, logprobs, marks, held text and the detokenizer go
    back to where they were after the tokens kept. The caller forgets the KV past the last
    token kept, which is fed again to sample the next one (also when ``n`` is 0: the sampled
    token was rejected, and its logits are gone)."""
    if not 0 <= n <= len(req.output_ids):
        raise ValueError(f"a value check took back {n} tokens of {len(req.output_ids)}")
    keep = len(req.output_ids) - n
    del req.tokens[len(req.prompt_ids) + keep:]
    del req.logprobs[keep:], req.top_logprobs[keep:]
    text_len, mark = req.marks[keep - 1] if keep else (0, (0, 0))
    del req.marks[keep:]
    full = req.text + req.held_text
    if text_len < len(req.text):  # NOTE: cannot happen while the hold is right
        req.fail(ErrorKind.ENGINE_FAILURE, "a value check took back text already sent")
        req.finish_reason = "error"
    req.held_text = full[len(req.text):text_len]
    req.detok.truncate(keep, mark)
