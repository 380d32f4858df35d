"""Turns logits into next tokens: greedy, or temperature / top-k / top-p / min-p, under an
optional per-row token bitmask. Each request has its own random stream (seed + draw counter), so
its samples do not depend on what else is in the batch."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grammarserve.sampling_params import SamplingParams


@dataclass
class RowRng:
    """A request's random stream: draw ``offset`` uses ``(seed, offset)`` only."""

    seed: int
    offset: int = 0


def make_rng(seed: int | None) -> RowRng:
    """The stream for a request (a random seed when ``seed`` is None)."""
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    return RowRng(seed)


@dataclass
class SampleOutput:
    token_ids: list[int]
    logprobs: list[float]  # log-probability of each chosen token under the processed distribution
    no_allowed: list[bool]  # the row's mask allowed no token (its token id is meaningless)


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """int32 ``[B, ceil(V/32)]`` (bit set = allowed) -> bool ``[B, V]``."""
    bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = (bitmask.unsqueeze(-1) >> bits) & 1
    return allowed.reshape(bitmask.shape[0], -1)[:, :vocab].bool()


def process_logits(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Apply temperature, top-k, top-p and min-p to one row ``[V]``; returns log-probs."""
    x = logits / p.temperature
    if p.top_k and p.top_k < x.numel():
        kth = torch.topk(x, p.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    logp = torch.log_softmax(x, dim=-1)
    if p.min_p > 0.0:
        logp = logp.masked_fill(logp < logp.max() + math.log(p.min_p), float("-inf"))
    if p.top_p < 1.0:
        sorted_lp, order = torch.sort(logp, descending=True)
        cum = sorted_lp.exp().cumsum(0)
        drop_sorted = (cum - sorted_lp.exp()) >= p.top_p  # keep the token that crosses top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logp = logp.masked_fill(drop, float("-inf"))
    return torch.log_softmax(logp, dim=-1)


def sample(logits: torch.Tensor, params: list[SamplingParams], rngs: list[RowRng | None],
           bitmask: torch.Tensor | None = None) -> SampleOutput:
    """Sample one token per row of ``logits`` ``[B, V]`` (fp32).

    ``bitmask`` (int32 ``[B, ceil(V/32)]``, bit set = allowed; all ones for unconstrained rows)
    restricts each row; a row with no allowed token is reported in ``no_allowed``. ``rngs[i]``
    is advanced by one draw for every sampled (non-greedy) row.
    """
    no_allowed = [False] * len(params)
    if bitmask is not None:
        allowed = unpack_bitmask(bitmask.to(logits.device), logits.shape[-1])
        logits = logits.masked_fill(~allowed, float("-inf"))
        no_allowed = (~allowed.any(dim=-1)).tolist()
    greedy_ids = logits.argmax(dim=-1)
    log_norm = torch.logsumexp(logits, dim=-1)
    ids: list[int] = []
    lps: list[float] = []
    for i, p in enumerate(params):
        if no_allowed[i]:
            ids.append(0)
            lps.append(float("-inf"))
            continue
        if p.greedy:
            tok = int(greedy_ids[i])
            ids.append(tok)
            lps.append(float(logits[i, tok] - log_norm[i]))
            continue
        rng = rngs[i]
        assert rng is not None, "a sampled row needs a random stream"
        gen = torch.Generator(device=logits.device).manual_seed(
            (rng.seed * 1_000_003 + rng.offset) % 2**63)
        rng.offset += 1
        logp = process_logits(logits[i], p)
        tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
        ids.append(tok)
        lps.append(float(logp[tok]))
    return SampleOutput(ids, lps, no_allowed)
