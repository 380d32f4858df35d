"""Top-k / min-p / top-p filtering of masked, temperature-scaled logits (torch, any device).

This is the sort path: rows that ask for a filter are masked and scaled first
(:func:`grammarserve_kernels.masked_scaled_logits`), filtered here, then sampled by the fused
kernel with temperature 1 and no bitmask. Top-k needs a partial sort (``topk``), min-p none, and
only top-p rows are fully sorted.
"""

from __future__ import annotations

import torch


def filter_logits(y: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                  min_p: torch.Tensor) -> torch.Tensor:
    """Set the tokens each row's filters remove to ``-inf``.

    Filters apply in this order, each to what the previous left: top-k (ties with the k-th value
    are kept), min-p (keep ``p >= min_p * p_max``), top-p (keep the smallest set of most likely
    tokens whose mass reaches ``top_p``, including the token that crosses it).

    Parameters
    ----------
    y:
        fp32 ``[B, V]`` masked, temperature-scaled logits (``-inf`` = not allowed).
    top_k:
        int64 ``[B]``; 0 (or >= V) = off.
    top_p:
        fp32 ``[B]``; 1 = off.
    min_p:
        fp32 ``[B]``; 0 = off.

    Returns
    -------
    torch.Tensor
        A new fp32 ``[B, V]`` tensor.
    """
    v = y.shape[-1]
    y = y.clone()
    k_on = (top_k > 0) & (top_k < v)
    if bool(k_on.any()):
        k = torch.where(k_on, top_k, 1)
        top = torch.topk(y, int(k.max()), dim=-1).values
        kth = top.gather(1, (k - 1)[:, None])
        kth = kth.masked_fill(~k_on[:, None], float("-inf"))
        y.masked_fill_(y < kth, float("-inf"))
    if bool((min_p > 0).any()):
        floor = y.amax(dim=-1, keepdim=True) + torch.log(min_p)[:, None]
        y.masked_fill_(y < floor, float("-inf"))
    rows = (top_p < 1).nonzero()[:, 0]
    if rows.numel():
        sub = y[rows]
        probs, order = torch.softmax(sub, dim=-1).sort(dim=-1, descending=True)
        before = probs.cumsum(dim=-1) - probs  # mass of the strictly more likely tokens
        drop = torch.zeros_like(before, dtype=torch.bool).scatter_(
            1, order, before >= top_p[rows, None])
        y[rows] = sub.masked_fill_(drop, float("-inf"))
    return y
