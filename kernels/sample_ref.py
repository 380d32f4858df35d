"""Torch reference of the fused mask + temperature + sample kernel; also the CPU path.

Sampling is Gumbel-max done in two levels so that only ``V / BLOCK + BLOCK`` noise values are drawn
per row instead of ``V``: the vocabulary is cut into blocks of :data:`SAMPLE_BLOCK` tokens, a block
is picked by Gumbel-max over the blocks' log-sum-exps (``P(block) = mass(block) / mass(row)``),
then a token inside it by Gumbel-max over its logits (``P(token | block) = p / mass(block)``), so
``P(token) = p(token)`` exactly. The Triton kernel runs the same two levels in one pass over the
vocabulary (plus one re-read of the chosen block), with the same noise counters.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from grammarserve_kernels.controls import SamplingControls, apply_controls_, check_controls
from grammarserve_kernels.noise import gumbel

# Tokens per block. Part of the sampling stream: the same key and block size give the same token.
SAMPLE_BLOCK = 1024

#: Most top log-probabilities per row (OpenAI's ``top_logprobs`` limit).
MAX_TOP = 20


class Sampled(NamedTuple):
    """What the sample kernels return for a batch of ``B`` rows.

    ``ids`` int64 ``[B]`` and ``logprobs`` fp32 ``[B]``: the chosen tokens and their
    log-probabilities (a row whose mask allows no token: ``-1`` and ``-inf``). ``top_ids`` int64
    and ``top_logprobs`` fp32 ``[B, K]`` (``K`` = the largest ``num_top`` asked, 0 when none):
    each row's most likely tokens, best first, under the distribution it was sampled from;
    entries past the row's own ``num_top`` or past its allowed tokens are ``-1`` / ``-inf``.
    """

    ids: torch.Tensor
    logprobs: torch.Tensor
    top_ids: torch.Tensor
    top_logprobs: torch.Tensor


_BYTE_BITS = torch.tensor([[(b >> j) & 1 == 0 for j in range(8)] for b in range(256)])


def check_inputs(logits: torch.Tensor, bitmask: torch.Tensor | None, temperature: torch.Tensor,
                 keys: torch.Tensor, controls: SamplingControls | None = None,
                 num_top: torch.Tensor | None = None) -> None:
    """Raise ``ValueError`` for shapes, dtypes or devices the samplers cannot take."""
    if logits.dim() != 2 or logits.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"logits must be [B, V] fp32/bf16/fp16, got {tuple(logits.shape)} "
                         f"{logits.dtype}")
    b, v = logits.shape
    if bitmask is not None:
        words = (v + 31) // 32
        if bitmask.dtype != torch.int32 or tuple(bitmask.shape) != (b, words):
            raise ValueError(f"bitmask must be int32 [B, ceil(V/32)] = [{b}, {words}], got "
                             f"{bitmask.dtype} {tuple(bitmask.shape)}")
        if bitmask.device != logits.device:
            raise ValueError("bitmask must be on the logits' device: use bitmask.to(logits.device)")
    if temperature.shape != (b,) or keys.shape != (b, 2):
        raise ValueError(f"temperature must be [B] and keys [B, 2] for B={b}, got "
                         f"{tuple(temperature.shape)} and {tuple(keys.shape)}")
    if temperature.device != logits.device or keys.device != logits.device:
        raise ValueError("temperature and keys must be on the logits' device")
    if controls is not None:
        check_controls(controls, b, v, logits.device)
    if num_top is not None:
        if num_top.shape != (b,) or num_top.dtype != torch.int64:
            raise ValueError(f"num_top must be int64 [B] for B={b}, got {num_top.dtype} "
                             f"{tuple(num_top.shape)}")
        if num_top.device != logits.device:
            raise ValueError("num_top must be on the logits' device")
        if b and not 0 <= int(num_top.min()) <= int(num_top.max()) <= MAX_TOP:
            raise ValueError(f"num_top must be in [0, {MAX_TOP}]")


def disallowed_mask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """int32 ``[B, ceil(V/32)]`` (bit set = allowed) -> bool ``[B, V]``, True where disallowed."""
    # Little-endian byte view: bit k of an int32 word is bit k % 8 of its byte k // 8.
    table = _BYTE_BITS.to(bitmask.device)
    as_bytes = bitmask.contiguous().view(torch.uint8)
    return table[as_bytes.long()].reshape(bitmask.shape[0], -1)[:, :vocab]


def apply_bitmask_(y: torch.Tensor, bitmask: torch.Tensor, vocab: int) -> None:
    """Set ``y[:, :vocab]`` (fp32) to ``-inf`` where ``bitmask`` has the bit clear, in place."""
    if y.device.type == "cpu" and y.is_contiguous():
        # NOTE: xgrammar's C++ loop does exactly this, 4-6x faster than unpacking bits in eager
        # torch on CPU; tests check it against disallowed_mask.
        import xgrammar

        xgrammar.apply_token_bitmask_inplace(y, bitmask.contiguous(), vocab_size=vocab)
    else:
        y[:, :vocab].masked_fill_(disallowed_mask(bitmask, vocab), float("-inf"))


def masked_scaled_logits(logits: torch.Tensor, bitmask: torch.Tensor | None,
                         temperature: torch.Tensor, *, width: int | None = None,
                         controls: SamplingControls | None = None) -> torch.Tensor:
    """fp32 ``logits / t`` with disallowed tokens at ``-inf`` (``t = 1`` on greedy rows), after
    the penalties and logit bias of ``controls`` (applied before the mask, so a bias never
    re-allows a masked token).

    Parameters
    ----------
    logits:
        ``[B, V]`` fp32/bf16/fp16.
    bitmask:
        int32 ``[B, ceil(V/32)]``, bit set = allowed, or None (no constraint).
    temperature:
        fp32 ``[B]``; 0 means greedy (the logits are left unscaled).
    width:
        Total columns of the result (``>= V``); columns past ``V`` are ``-inf``.
    controls:
        Penalties and logit bias (:mod:`grammarserve_kernels.controls`), or None.

    Returns
    -------
    torch.Tensor
        fp32 ``[B, width or V]``.
    """
    b, v = logits.shape
    t = torch.where(temperature == 0, 1.0, temperature).to(torch.float32)
    y = torch.empty(b, width or v, dtype=torch.float32, device=logits.device)
    y[:, v:] = float("-inf")
    if controls is None:
        torch.div(logits, t[:, None], out=y[:, :v])
    else:
        y[:, :v] = logits
        apply_controls_(y[:, :v], controls)
        y[:, :v] /= t[:, None]
    if bitmask is not None:
        apply_bitmask_(y, bitmask, v)
    return y


def top_entries(y: torch.Tensor, lse: torch.Tensor, num_top: torch.Tensor,
                rows: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top log-probabilities from processed logits (shared by the torch and Triton paths).

    ``y`` fp32 ``[T, V]`` holds the processed logits (``-inf`` = not allowed) of batch rows
    ``rows`` ``[T]``, and ``lse`` ``[T]`` their log-sum-exp; ``num_top`` int64 ``[B]`` is each
    row's count. Returns int64 ids and fp32 log-probabilities ``[B, K]`` laid out as
    :class:`Sampled` describes (``K = max(num_top)``).
    """
    k = min(int(num_top.max()), y.shape[1]) if b else 0
    ids = torch.full((b, k), -1, dtype=torch.int64, device=y.device)
    lps = torch.full((b, k), float("-inf"), dtype=torch.float32, device=y.device)
    if k and rows.numel():
        vals, top = torch.topk(y, k, dim=-1)
        # NOTE: masked tokens (-inf) are never listed: top_logprobs only show allowed tokens.
        keep = torch.isfinite(vals) & (torch.arange(k, device=y.device) < num_top[rows, None])
        ids[rows] = top.masked_fill(~keep, -1)
        lps[rows] = (vals - lse[:, None]).masked_fill(~keep, float("-inf"))
    return ids, lps


def sample_tokens_ref(logits: torch.Tensor, bitmask: torch.Tensor | None,
                      temperature: torch.Tensor, keys: torch.Tensor, *,
                      controls: SamplingControls | None = None,
                      num_top: torch.Tensor | None = None) -> Sampled:
    """Apply the controls, mask, scale and sample one token per row (torch; any device).

    Parameters
    ----------
    logits:
        ``[B, V]`` fp32/bf16/fp16.
    bitmask:
        int32 ``[B, ceil(V/32)]``, bit set = allowed, or None.
    temperature:
        fp32 ``[B]``; 0 = greedy (argmax, first index on ties).
    keys:
        int64 ``[B, 2]`` random-stream keys (:func:`grammarserve_kernels.stream_keys`); ignored
        for greedy rows.
    controls:
        Penalties and logit bias (:mod:`grammarserve_kernels.controls`), applied before the
        mask; None = none.
    num_top:
        int64 ``[B]``: how many top log-probabilities each row wants (0..20), or None.

    Returns
    -------
    Sampled
        The chosen tokens and their log-probabilities under the processed (penalized, biased,
        masked, temperature-scaled) distribution, plus the top log-probabilities under the same
        distribution. A row whose mask allows no token gets id ``-1`` and log-probability
        ``-inf``.
    """
    b, v = logits.shape
    if all_greedy(temperature, controls, num_top):
        return greedy_tokens_ref(logits, bitmask)
    nblocks = -(-v // SAMPLE_BLOCK)
    y = masked_scaled_logits(logits, bitmask, temperature, width=nblocks * SAMPLE_BLOCK,
                             controls=controls)
    # NOTE: few ops on purpose: on CPU each torch op is a parallel region, costly when small.
    probs = torch.softmax(y, dim=-1)  # NaN rows where nothing is allowed
    mass = probs.view(b, nblocks, SAMPLE_BLOCK).sum(dim=-1)
    empty = ~(mass.sum(dim=-1) > 0)

    greedy = temperature == 0
    ids = y.argmax(dim=-1) if bool(greedy.any()) else torch.zeros(b, dtype=torch.long,
                                                                  device=y.device)
    sampled = (~greedy & ~empty).nonzero()[:, 0]
    if sampled.numel():
        # The two Gumbel-max stages touch V / BLOCK + BLOCK values per row: done on the host.
        row_keys = keys[sampled].cpu().numpy()
        block_ctr = np.arange(nblocks, dtype=np.uint32)[None, :] * 2 + 1
        log_mass = mass[sampled].log().cpu().numpy()
        block = (log_mass + gumbel(row_keys, block_ctr)).argmax(axis=1)
        first = block * SAMPLE_BLOCK
        token_ctr = (first[:, None] + np.arange(SAMPLE_BLOCK)) * 2
        inside = y.view(b, nblocks, SAMPLE_BLOCK)[sampled, torch.from_numpy(block).to(y.device)]
        token = (inside.cpu().numpy() + gumbel(row_keys, token_ctr)).argmax(axis=1)
        ids[sampled] = torch.from_numpy(first + token).to(y.device)

    # log p read from the softmax: within float rounding of y[tok] - logsumexp(y).
    logprobs = probs.gather(1, ids[:, None])[:, 0].log()
    if num_top is None:
        num_top = torch.zeros(b, dtype=torch.int64, device=y.device)
    rows = (num_top > 0).nonzero()[:, 0]
    lse = torch.logsumexp(y[rows], dim=-1)
    top = top_entries(y[rows, :v], lse, num_top, rows, b)
    if rows.numel():  # NOTE: the same formula as the top entries, so the two agree exactly
        logprobs[rows] = y[rows, ids[rows]] - lse
    return Sampled(ids.masked_fill(empty, -1), logprobs.masked_fill(empty, float("-inf")), *top)


def all_greedy(temperature: torch.Tensor, controls: SamplingControls | None,
               num_top: torch.Tensor | None) -> bool:
    """Every row greedy, without controls or top log-probabilities: the case
    :func:`greedy_tokens_ref` (and the CPU kernel ``greedy.py``) serve."""
    return (controls is None and num_top is None and temperature.numel() > 0
            and not bool((temperature != 0).any()))


def greedy_tokens_ref(logits: torch.Tensor, bitmask: torch.Tensor | None) -> Sampled:
    """All rows greedy (see :func:`all_greedy`): the argmax of the masked logits (first index on
    ties) and its log-probability ``y[id] - logsumexp(y)``, without the softmax and block masses
    the sampled rows need."""
    b, v = logits.shape
    y = logits.to(torch.float32)
    if bitmask is not None:
        y = y.clone() if y is logits else y
        apply_bitmask_(y, bitmask, v)
    ids = y.argmax(dim=-1)
    logprobs = y.gather(1, ids[:, None])[:, 0] - torch.logsumexp(y, dim=-1)
    empty = torch.isneginf(logprobs) | torch.isnan(logprobs)
    none = torch.zeros(b, 0, dtype=torch.int64, device=y.device)
    return Sampled(ids.masked_fill(empty, -1), logprobs.masked_fill(empty, float("-inf")), none,
                   torch.zeros(b, 0, dtype=torch.float32, device=y.device))
