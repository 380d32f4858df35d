"""Helpers that check a compiled grammar against JSON instances token by token (used by the
tests and ``benchmarks/bench_grammar.py``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grammarserve.fsm.matcher import Matcher


@dataclass(frozen=True)
class SuiteCase:
    """One schema of the JSON-Schema-Test-Suite with its instances."""

    file: str
    description: str
    schema: Any
    tests: tuple[tuple[str, Any, bool], ...]  # (description, instance, valid)


def load_suite(folder: str | Path) -> Iterator[SuiteCase]:
    """Every test group of every ``*.json`` file directly in ``folder`` (sorted)."""
    for path in sorted(Path(folder).glob("*.json")):
        for group in json.loads(path.read_text()):
            tests = tuple((t["description"], t["data"], bool(t["valid"])) for t in group["tests"])
            yield SuiteCase(path.name, group["description"], group["schema"], tests)


def instance_texts(instance: Any) -> list[str]:
    """The forms the default JSON style (``auto``) takes: compact and ``json.dumps`` default."""
    forms = [json.dumps(instance, ensure_ascii=False, separators=(",", ":")),
             json.dumps(instance, ensure_ascii=False)]
    return list(dict.fromkeys(forms))


def bit(bitmask: torch.Tensor, row: int, token: int) -> bool:
    """Whether ``token`` is allowed in ``bitmask[row]``."""
    return bool((int(bitmask[row, token // 32]) >> (token % 32)) & 1)


def walk(matcher: Matcher, tokens: list[int], stop_token: int, bitmask: torch.Tensor,
         row: int = 0, mask_times: list[float] | None = None) -> tuple[bool, str]:
    """Feed ``tokens`` then ``stop_token``, checking each against the mask first (appending
    each ``fill_bitmask`` duration in seconds to ``mask_times`` if given).

    Returns
    -------
    (bool, str)
        ``(True, "")`` if every token was allowed and accepted and the matcher terminated;
        else ``(False, reason)``.
    """
    for i, tok in enumerate(tokens + [stop_token]):
        if mask_times is None:
            matcher.fill_bitmask(bitmask, row)
        else:
            start = time.perf_counter()
            matcher.fill_bitmask(bitmask, row)
            mask_times.append(time.perf_counter() - start)
        if not bit(bitmask, row, tok):
            return False, f"token {i} ({tok}) masked out"
        if not matcher.accept_token(tok):
            return False, f"token {i} ({tok}) allowed by the mask but refused: {matcher.error()}"
    if not matcher.is_terminated():
        return False, "not terminated after the stop token"
    return True, ""


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
                if not bit(bitmask, 0, t) or not matcher.accept_token(t):
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
        if not matcher.accept_token(t):
            return False, f"token {t} refused after {out!r}: {matcher.error()}", n_forced
        out += token_bytes[t]
    matcher.fill_bitmask(bitmask, 0)
    if not (bit(bitmask, 0, stop_token) and matcher.accept_token(stop_token)
            and matcher.is_terminated()):
        return False, "the stop token is not accepted at the end", n_forced
    return True, "", n_forced


def load_corpus(folder: str | Path) -> Iterator[SuiteCase]:
    """The ``schemas/*.json`` corpus (``{"name", "schema", "valid", "invalid"}`` per file)."""
    for path in sorted(Path(folder).glob("*.json")):
        doc = json.loads(path.read_text())
        tests = tuple([(f"valid[{i}]", v, True) for i, v in enumerate(doc.get("valid", []))] +
                      [(f"invalid[{i}]", v, False) for i, v in enumerate(doc.get("invalid", []))])
        yield SuiteCase(path.name, doc.get("description", doc.get("name", path.stem)),
                        doc["schema"], tests)
