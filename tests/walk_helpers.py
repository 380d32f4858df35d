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


#: Bytes that move JSON along: a token holding one is drawn more often by ``random_walk``.
STRUCTURAL = frozenset(b'"{}[],:')


def structural_tokens(token_bytes: list[bytes]) -> np.ndarray:
    """A bool per token id: whether its bytes hold a byte of :data:`STRUCTURAL`."""
    return np.array([any(b in STRUCTURAL for b in t) for t in token_bytes], dtype=bool)


def random_walk(matcher: Matcher, bitmask: torch.Tensor, stop_token: int,
                token_bytes: list[bytes], structural: np.ndarray, rng: Any, *,
                max_tokens: int = 200, p_stop: float = 0.5,
                p_structural: float = 0.5) -> tuple[bytes | None, str]:
    """Generate through ``matcher`` by random legal tokens, as a sampler under the mask would:
    forced tokens (jump-forward) taken where offered; else the stop token with probability
    ``p_stop`` where allowed; else, with probability ``p_structural``, a token holding a
    structural byte (``structural``, so the walk closes strings and containers), else any
    allowed token, each uniformly from ``rng`` (a ``random.Random``). Tokens a value check
    retracts are dropped from the output, as the engine does.

    Returns
    -------
    (bytes | None, str)
        ``(output, "")`` once the stop token was accepted; ``(None, why)`` if the matcher
        failed (an allowed token refused: a bug), its value checks ran out of retries (``why``
        begins with ``"exhausted"``: the engine fails such a request too) or ``max_tokens``
        passed (``why`` is ``"unfinished"``).
    """
    out: list[int] = []

    def text() -> bytes:
        return b"".join(token_bytes[t] for t in out if t != stop_token)

    for _ in range(max_tokens):
        matcher.fill_bitmask(bitmask, 0)
        if matcher.is_error():
            return None, f"matcher error after {text()!r}: {matcher.error()}"
        forced = matcher.forced_tokens()
        if forced:
            choice = forced
        else:
            bits = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")
            bits = bits[:len(structural)]
            allowed = np.flatnonzero(bits)
            if len(allowed) == 0:
                return None, f"no token allowed after {text()!r}"
            if bits[stop_token] and rng.random() < p_stop:
                choice = [stop_token]
            else:
                pool = allowed[allowed != stop_token]
                if rng.random() < p_structural and structural[pool].any():
                    pool = pool[structural[pool]]
                if len(pool) == 0:
                    pool = allowed
                choice = [int(pool[rng.randrange(len(pool))])]
        for t in choice:
            if not matcher.accept_token(t):
                if matcher.exhausted:
                    return None, f"exhausted: {matcher.error()}"
                return None, f"allowed token {t} refused after {text()!r}: {matcher.error()}"
            out.append(t)
            dropped = matcher.take_retraction()
            if dropped:
                del out[len(out) - dropped:]
            if matcher.is_terminated():
                return text(), ""
    return None, "unfinished"
