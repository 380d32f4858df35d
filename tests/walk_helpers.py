"""Test helper: generate a text through a matcher the way the engine does with jump-forward
(forced spans taken where the matcher offers them), checking every span against the mask."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from grammarserve.fsm.conformance import bit
from grammarserve.fsm.matcher import Matcher


def allowed_tokens(bitmask: torch.Tensor, row: int = 0) -> list[int]:
    """The token ids allowed in ``bitmask[row]``."""
    bits = np.unpackbits(bitmask[row].numpy().view(np.uint8), bitorder="little")
    return np.flatnonzero(bits).tolist()


def _offsets(ids: list[int], token_bytes: list[bytes], start: int) -> dict[int, int]:
    """Byte offset -> the token that starts there."""
    out, pos = {}, start
    for t in ids:
        out[pos] = t
        pos += len(token_bytes[t])
    return out


def walk_jump_forward(matcher: Matcher, text: str, tokenizer: Any, bitmask: torch.Tensor,
                      stop_token: int, token_bytes: list[bytes]) -> tuple[bool, str, int]:
    """Generate ``text`` the way the engine does with jump-forward: take the forced tokens
    wherever the matcher offers them, else the next token of ``text`` (re-tokenizing the rest
    when a forced span ended inside one of its tokens), then ``stop_token``.

    Checks that every forced span continues ``text``, is offered only where the grammar may not
    end, agrees with every token the mask allows there, and that each forced token is allowed
    by the mask when accepted.

    Returns
    -------
    (bool, str, int)
        ``(True, "", n_forced)`` if ``text`` was generated and the matcher terminated; else
        ``(False, reason, n_forced)``.
    """
    out, target, n_forced = b"", text.encode(), 0
    plan = _offsets(tokenizer.encode(text, add_special_tokens=False), token_bytes, 0)
    while out != target:
        matcher.fill_bitmask(bitmask, 0)
        forced = matcher.forced_tokens()
        if forced:
            span = b"".join(token_bytes[t] for t in forced)
            if bit(bitmask, 0, stop_token):
                return False, f"forced tokens offered where the grammar may end ({out!r})", \
                    n_forced
            if not target[len(out):].startswith(span):
                return False, f"forced span {span!r} does not continue {out!r}", n_forced
            for t in allowed_tokens(bitmask):
                piece = token_bytes[t]
                if not (span.startswith(piece) or piece.startswith(span)):
                    return False, f"mask allows {piece!r} beside forced {span!r}", n_forced
            for t in forced:
                matcher.fill_bitmask(bitmask, 0)
                if not bit(bitmask, 0, t) or not matcher.accept_token(t) \
                        or matcher.take_retraction():
                    return False, f"forced token {t} refused: {matcher.error()}", n_forced
            out += span
            n_forced += len(forced)
            continue
        if len(out) not in plan:
            rest = tokenizer.encode(target[len(out):].decode(), add_special_tokens=False)
            plan.update(_offsets(rest, token_bytes, len(out)))
        t = plan[len(out)]
        if not bit(bitmask, 0, t):
            return False, f"next token {t} masked out after {out!r}", n_forced
        if not matcher.accept_token(t) or matcher.take_retraction():
            return False, f"token {t} refused after {out!r}: {matcher.error()}", n_forced
        out += token_bytes[t]
    matcher.fill_bitmask(bitmask, 0)
    if not (bit(bitmask, 0, stop_token) and matcher.accept_token(stop_token)
            and not matcher.take_retraction() and matcher.is_terminated()):
        return False, "the stop token is not accepted at the end", n_forced
    return True, "", n_forced
