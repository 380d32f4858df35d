"""Turns logits into next tokens: greedy, or temperature / top-k / top-p / min-p, under an
optional per-row token bitmask, after the OpenAI controls (frequency / presence / repetition
penalties, logit bias), with top log-probabilities on request. Each request has its own random
stream (seed + draw counter), so its samples do not depend on what else is in the batch.

The work is done by the fused mask + sample kernel in ``grammarserve_kernels`` (Triton on CUDA,
torch on CPU). Rows that ask for top-k / top-p / min-p are penalized, masked and scaled first,
filtered (the sort path), then sampled by the same kernel with temperature 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from grammarserve_kernels import (
    Sampled,
    SamplingControls,
    build_controls,
    filter_logits,
    greedy_tokens,
    masked_scaled_logits,
    sample_tokens,
    stream_keys,
)

from grammarserve.attention.staging import to_device
from grammarserve.engine.dry import DryParams, DryPenalty
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


class History(NamedTuple):
    """A row's tokens so far (prompt + generated, forced tokens included): what the penalties
    count. ``tokens[prompt_len:]`` are the generated ones."""

    tokens: Sequence[int]
    prompt_len: int


#: A token id and its log-probability.
TopEntry = tuple[int, float]


@dataclass
class SampleOutput:
    token_ids: list[int]
    logprobs: list[float]  # log-probability of each chosen token under the processed distribution
    no_allowed: list[bool]  # the row's mask allowed no token (its token id is 0, logprob -inf)
    # per row: its most likely allowed tokens, best first ([] when top_logprobs is 0)
    top: list[list[TopEntry]] = field(default_factory=list)


def _filtered(p: SamplingParams, vocab: int) -> bool:
    return not p.greedy and (0 < p.top_k < vocab or p.top_p < 1.0 or p.min_p > 0.0)


def _filter_args(params: list[SamplingParams],
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
            torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            torch.tensor([p.min_p for p in params], dtype=torch.float32, device=device))


def _apply_dry(logits: torch.Tensor, params: list[SamplingParams],
               history: Sequence[History] | None, dry: DryPenalty | None) -> None:
    """Add this step's DRY biases to ``logits`` in place (rows with ``dry_multiplier``)."""
    rows = [i for i, p in enumerate(params) if p.dry_multiplier]
    if not rows:
        return
    if history is None or dry is None:
        raise ValueError("dry_multiplier needs each row's History and the sampler's DryPenalty")
    where: list[int] = []
    ids: list[int] = []
    values: list[float] = []
    for i in rows:
        p = params[i]
        bias = dry.bias(history[i].tokens[history[i].prompt_len:],
                        DryParams(p.dry_multiplier or 0.0, p.dry_base, p.dry_allowed_length))
        where += [i] * len(bias)
        ids += list(bias)
        values += list(bias.values())
    if ids:  # NOTE: most steps none; a few entries, so one small index_put, no controls pass
        dev = logits.device
        with torch.inference_mode():  # NOTE: the model's logits are inference tensors
            logits.index_put_((to_device(torch.tensor(where), dev),
                               to_device(torch.tensor(ids), dev)),
                              to_device(torch.tensor(values, dtype=logits.dtype), dev),
                              accumulate=True)


def _controls(params: list[SamplingParams], history: Sequence[History] | None, vocab: int,
              device: torch.device) -> SamplingControls | None:
    rows = [i for i, p in enumerate(params) if p.penalized or p.logit_bias]
    if not rows:
        return None
    if history is None and any(params[i].penalized for i in rows):
        raise ValueError("penalties need each row's History (prompt + generated tokens)")

    def generated(i: int) -> list[int]:
        if history is None or not params[i].penalized:
            return []
        return list(history[i].tokens[history[i].prompt_len:])

    def prompt(i: int) -> list[int] | None:
        if history is None or params[i].repetition_penalty == 1.0:
            return None
        return list(history[i].tokens[:history[i].prompt_len])

    return build_controls(
        len(params), vocab, device, rows=rows, generated=[generated(i) for i in rows],
        prompts=[prompt(i) for i in rows],
        bias=[dict(params[i].logit_bias or {}) for i in rows],
        frequency=[params[i].frequency_penalty for i in rows],
        presence=[params[i].presence_penalty for i in rows],
        repetition=[params[i].repetition_penalty for i in rows])


def _top_lists(params: list[SamplingParams], res: Sampled) -> list[list[TopEntry]]:
    if not res.top_ids.shape[1]:
        return [[] for _ in params]
    ids, lps = res.top_ids.tolist(), res.top_logprobs.tolist()
    return [[(t, lp) for t, lp in zip(ids[i], lps[i]) if t >= 0][:p.top_logprobs]
            for i, p in enumerate(params)]


def sample(logits: torch.Tensor, params: list[SamplingParams], rngs: list[RowRng | None],
           bitmask: torch.Tensor | None = None, *,
           history: Sequence[History] | None = None,
           dry: DryPenalty | None = None) -> SampleOutput:
    """Sample one token per row of ``logits`` ``[B, V]`` (fp32, bf16 or fp16).

    ``bitmask`` (int32 ``[B, ceil(V/32)]``, bit set = allowed; all ones for unconstrained rows;
    best on the logits' device already, else it is staged through pinned memory) restricts
    each row; a row with no allowed token is reported in ``no_allowed``. ``rngs[i]``
    is advanced by one draw for every sampled (non-greedy) row. Greedy rows take the argmax of the
    masked logits and report its log-probability under the masked softmax; sampled rows report
    the chosen token's log-probability under the masked, temperature-scaled, filtered
    distribution. Penalties and logit bias apply before the mask (a bias never re-allows a
    masked token); they count the tokens of ``history`` (one per row; needed when a row has a
    penalty); ``dry`` adds the DRY biases of rows with ``dry_multiplier`` to ``logits`` in
    place (which this call then owns). ``top`` lists,
    for rows with ``top_logprobs``, the most likely tokens the mask (and the filters) allow,
    under the distribution the token was sampled from.
    """
    b, vocab = logits.shape
    if len(params) != b or len(rngs) != b:
        raise ValueError(f"need one SamplingParams and one RowRng|None per row: {b} rows, "
                         f"{len(params)} params, {len(rngs)} rngs")
    if history is not None and len(history) != b:
        raise ValueError(f"need one History per row: {b} rows, {len(history)} histories")
    dev = logits.device
    _apply_dry(logits, params, history, dry)
    if dev.type == "cpu" and (bitmask is None or bitmask.device.type == "cpu") and all(
            p.greedy and not p.penalized and not p.logit_bias and not p.top_logprobs
            for p in params):
        # NOTE: the common CPU case, without the keys, temperatures and controls it would skip
        res = greedy_tokens(logits, bitmask)
        ids, lps = res.ids.tolist(), res.logprobs.tolist()
        return SampleOutput([max(t, 0) for t in ids], lps, [t < 0 for t in ids],
                            [[] for _ in params])
    draws = []
    for p, rng in zip(params, rngs):
        if p.greedy:
            draws.append((0, 0))
            continue
        if rng is None:
            raise ValueError("a sampled (temperature > 0) row needs a RowRng: make_rng(seed)")
        draws.append((rng.seed, rng.offset))
        rng.offset += 1
    keys = to_device(stream_keys([s for s, _ in draws], [o for _, o in draws]), dev)
    temps = to_device(torch.tensor([p.temperature for p in params], dtype=torch.float32), dev)
    if bitmask is not None:  # NOTE: the engine's is on ``dev`` already (bitmask_ring.py)
        bitmask = to_device(bitmask, dev)
    controls = _controls(params, history, vocab, dev)
    num_top = None
    if any(p.top_logprobs for p in params):
        num_top = torch.tensor([p.top_logprobs for p in params], dtype=torch.int64, device=dev)

    filt = [i for i, p in enumerate(params) if _filtered(p, vocab)]
    if not filt:
        res = sample_tokens(logits, bitmask, temps, keys, controls=controls, num_top=num_top)
    else:
        parts = [(filt, _sample_filtered(logits, bitmask, temps, keys, controls, num_top, params,
                                          filt))]
        plain = sorted(set(range(b)) - set(filt))
        if plain:
            rows = torch.tensor(plain, dtype=torch.int64, device=dev)
            parts.append((plain, sample_tokens(
                logits[rows], None if bitmask is None else bitmask[rows], temps[rows],
                keys[rows], controls=None if controls is None else controls.select(rows),
                num_top=None if num_top is None else num_top[rows])))
        res = _merge(b, dev, parts)
    # NOTE: the step's one device -> host copy (ids are exact in float64; -1 = nothing allowed)
    ids, logprobs = torch.stack((res.ids.double(), res.logprobs.double())).cpu().tolist()
    return SampleOutput([max(int(t), 0) for t in ids], logprobs, [t < 0 for t in ids],
                        _top_lists(params, res))


def _sample_filtered(logits: torch.Tensor, bitmask: torch.Tensor | None, temps: torch.Tensor,
                     keys: torch.Tensor, controls: SamplingControls | None,
                     num_top: torch.Tensor | None, params: list[SamplingParams],
                     filt: list[int]) -> Sampled:
    """The sort path: controls, mask and temperature, then top-k / top-p / min-p, then the
    kernel at temperature 1 (its top log-probabilities come from the filtered distribution)."""
    rows = torch.tensor(filt, dtype=torch.int64, device=logits.device)
    y = masked_scaled_logits(logits[rows], None if bitmask is None else bitmask[rows],
                             temps[rows],
                             controls=None if controls is None else controls.select(rows))
    y = filter_logits(y, *_filter_args([params[i] for i in filt], logits.device))
    return sample_tokens(y, None, torch.ones_like(temps[rows]), keys[rows],
                         num_top=None if num_top is None else num_top[rows])


def _merge(b: int, device: torch.device, parts: list[tuple[list[int], Sampled]]) -> Sampled:
    """One :class:`Sampled` for ``b`` rows from sub-batches (their rows, their result)."""
    k = max(r.top_ids.shape[1] for _, r in parts)
    ids = torch.empty(b, dtype=torch.int64, device=device)
    logprobs = torch.empty(b, dtype=torch.float32, device=device)
    top_ids = torch.full((b, k), -1, dtype=torch.int64, device=device)
    top_lps = torch.full((b, k), float("-inf"), dtype=torch.float32, device=device)
    for rows, r in parts:
        index = torch.tensor(rows, dtype=torch.int64, device=device)
        ids[index], logprobs[index] = r.ids, r.logprobs
        top_ids[index, :r.top_ids.shape[1]] = r.top_ids
        top_lps[index, :r.top_ids.shape[1]] = r.top_logprobs
    return Sampled(ids, logprobs, top_ids, top_lps)
