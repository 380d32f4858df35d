"""Turns logits into next tokens: greedy, or temperature / top-k / top-p / min-p with a per-request
seeded generator (so a request's samples do not depend on what else is in the batch)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grammarserve.sampling_params import SamplingParams


@dataclass
class SampleOutput:
    token_ids: list[int]
    logprobs: list[float]  # log-probability of each chosen token under the processed distribution


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


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> SampleOutput:
    """Sample one token per row of ``logits`` ``[B, V]`` (fp32)."""
    greedy_ids = logits.argmax(dim=-1)
    log_norm = torch.logsumexp(logits, dim=-1)
    ids: list[int] = []
    lps: list[float] = []
    for i, p in enumerate(params):
        if p.greedy:
            tok = int(greedy_ids[i])
            ids.append(tok)
            lps.append(float(logits[i, tok] - log_norm[i]))
            continue
        logp = process_logits(logits[i], p)
        tok = int(torch.multinomial(logp.exp(), 1, generator=generators[i]))
        ids.append(tok)
        lps.append(float(logp[tok]))
    return SampleOutput(ids, lps)
