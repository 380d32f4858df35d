"""Turns logits into next tokens: greedy, or temperature / top-k / top-p / min-p, under an
optional per-row token bitmask. Each request has its own random stream (seed + draw counter), so
its samples do not depend on what else is in the batch.

The work is done by the fused mask + sample kernel in ``grammarserve_kernels`` (Triton on CUDA,
torch on CPU). Rows that ask for top-k / top-p / min-p are masked and scaled first, filtered
(the sort path), then sampled by the same kernel with temperature 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from grammarserve_kernels import filter_logits, masked_scaled_logits, sample_tokens, stream_keys
from grammarserve_kernels.sample_ref import disallowed_mask

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
    no_allowed: list[bool]  # the row's mask allowed no token (its token id is 0, logprob -inf)


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """int32 ``[B, ceil(V/32)]`` (bit set = allowed) -> bool ``[B, V]``."""
    return ~disallowed_mask(bitmask, vocab)


def _filtered(p: SamplingParams, vocab: int) -> bool:
    return not p.greedy and (0 < p.top_k < vocab or p.top_p < 1.0 or p.min_p > 0.0)


def _filter_args(params: list[SamplingParams],
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
            torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            torch.tensor([p.min_p for p in params], dtype=torch.float32, device=device))


def process_logits(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Apply temperature, top-k, top-p and min-p to one row ``[V]``; returns log-probs."""
    temperature = torch.tensor([p.temperature], dtype=torch.float32, device=logits.device)
    y = masked_scaled_logits(logits[None], None, temperature)
    return torch.log_softmax(filter_logits(y, *_filter_args([p], logits.device))[0], dim=-1)


def sample(logits: torch.Tensor, params: list[SamplingParams], rngs: list[RowRng | None],
           bitmask: torch.Tensor | None = None) -> SampleOutput:
    """Sample one token per row of ``logits`` ``[B, V]`` (fp32, bf16 or fp16).

    ``bitmask`` (int32 ``[B, ceil(V/32)]``, bit set = allowed; all ones for unconstrained rows)
    restricts each row; a row with no allowed token is reported in ``no_allowed``. ``rngs[i]``
    is advanced by one draw for every sampled (non-greedy) row. Greedy rows take the argmax of the
    masked logits and report its log-probability under the masked softmax; sampled rows report
    the chosen token's log-probability under the masked, temperature-scaled, filtered
    distribution.
    """
    b, vocab = logits.shape
    if len(params) != b or len(rngs) != b:
        raise ValueError(f"need one SamplingParams and one RowRng|None per row: {b} rows, "
                         f"{len(params)} params, {len(rngs)} rngs")
    dev = logits.device
    draws = []
    for p, rng in zip(params, rngs):
        if p.greedy:
            draws.append((0, 0))
            continue
        if rng is None:
            raise ValueError("a sampled (temperature > 0) row needs a RowRng: make_rng(seed)")
        draws.append((rng.seed, rng.offset))
        rng.offset += 1
    keys = stream_keys([s for s, _ in draws], [o for _, o in draws], device=dev)
    temps = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=dev)
    if bitmask is not None:
        bitmask = bitmask.to(dev, non_blocking=True)

    filt = [i for i, p in enumerate(params) if _filtered(p, vocab)]
    if not filt:
        ids, logprobs = sample_tokens(logits, bitmask, temps, keys)
    else:
        ids = torch.empty(b, dtype=torch.int64, device=dev)
        logprobs = torch.empty(b, dtype=torch.float32, device=dev)
        rows = torch.tensor(filt, device=dev)
        y = masked_scaled_logits(logits[rows], None if bitmask is None else bitmask[rows],
                                 temps[rows])
        y = filter_logits(y, *_filter_args([params[i] for i in filt], dev))
        ids[rows], logprobs[rows] = sample_tokens(y, None, torch.ones_like(temps[rows]), keys[rows])
        plain = torch.tensor(sorted(set(range(b)) - set(filt)), dtype=torch.int64, device=dev)
        if plain.numel():
            ids[plain], logprobs[plain] = sample_tokens(
                logits[plain], None if bitmask is None else bitmask[plain], temps[plain],
                keys[plain])
    no_allowed = ids < 0
    ids = ids.masked_fill(no_allowed, 0)
    return SampleOutput(ids.tolist(), logprobs.tolist(), no_allowed.tolist())
