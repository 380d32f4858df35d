"""Decode attention as batched matmuls, with the shared prompt prefix read once (cascade).

Requests behind the same prompt (system prompt, tool schemas, few-shot examples) hold the same KV
pool slots for it: the radix cache hands every one of them the slots of the cached prefix. A decode
step that attends each request to its own copy reads that prefix once per request; on a CPU,
where decode attention is bound by memory traffic, that is most of its cost. Here the prefix
that all rows share is kept contiguous once (:class:`SharedPrefixKV`); every query of the group
is scored against it in one matmul, the rest of each row (the KV mirror) in a second, and one
softmax runs over both parts. This is FlashInfer's cascade attention, in torch.
"""

from __future__ import annotations

import torch

from grammarserve.engine.kv_pool import KVPool

MIN_SHARED = 64  # shorter common prefixes are attended per row (not worth a separate part)


class SharedPrefixKV:
    """Per-layer ``[kv_heads, P, head_dim]`` K and V of the prefix shared by a group's rows.

    NOTE: the copy is reused across steps only while the KV mirror is (same requests, in the
    same order): those requests hold the radix-cache locks on the shared slots all along, so the
    slots cannot have been freed and rewritten. Any mirror rebuild calls :meth:`invalidate`.
    """

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self.length = 0
        self._slots: torch.Tensor | None = None
        self._stale = True
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []

    def plan(self, rows: torch.Tensor) -> int:
        """``rows`` ``[B, L]``: each row's KV slots of positions ``0 .. L-1`` (L = the shortest
        prefix in the group). Returns the shared length P for this step (0 = none)."""
        if rows.shape[0] < 2 or rows.shape[1] < MIN_SHARED:
            self.length, self._slots = 0, None
            return 0
        diff = (rows != rows[0]).any(0)
        p = int(diff.to(torch.int8).argmax()) if bool(diff.any()) else rows.shape[1]
        old = self.length
        if MIN_SHARED <= old <= p < 2 * old:
            p = old  # keep P (and the mirror behind it) until the common prefix has doubled
        if p < MIN_SHARED:
            p = 0
        self.length, self._slots = p, rows[0, :p].clone() if p else None
        return p

    def invalidate(self) -> None:
        self._stale = True

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The shared K, V of ``layer``, gathered from the pool when stale."""
        if self._stale or layer >= len(self.k):
            assert self._slots is not None
            k = self.pool.k[layer].index_select(0, self._slots).transpose(0, 1).contiguous()
            v = self.pool.v[layer].index_select(0, self._slots).transpose(0, 1).contiguous()
            if layer < len(self.k):
                self.k[layer], self.v[layer] = k, v
            else:
                self.k.append(k)
                self.v.append(v)
            if layer == len(self.pool.k) - 1:
                self._stale = False
        return self.k[layer], self.v[layer]


def additive_mask(mask: torch.Tensor, kv_heads: int, heads: int,
                  dtype: torch.dtype) -> torch.Tensor:
    """``[B, Lq, S]`` bool -> ``[B*kv_heads, group*Lq, S]`` (0 or -inf) in the grouped-query
    layout of :func:`matmul_attention`."""
    b, lq, s = mask.shape
    group = heads // kv_heads
    add = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, -torch.inf)
    return add[:, None, None].expand(b, kv_heads, group, lq, s).reshape(b * kv_heads,
                                                                         group * lq, s)


def matmul_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, add_mask: torch.Tensor,
                     shared: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Grouped-query attention: q ``[B, H, Lq, d]``; k/v ``[B, kv_heads, S, d]`` contiguous (each
    row's own keys, masked by ``add_mask``); ``shared`` k/v ``[kv_heads, P, d]``: keys before
    every row's own, visible to every query. Returns ``[B, H, Lq, d]``. Each K/V head is read once
    for all the query heads that share it, and the shared part once for the whole group."""
    b, h, lq, d = q.shape
    kvh, s = k.shape[1], k.shape[2]
    gq = (h // kvh) * lq
    qg = q.reshape(b * kvh, gq, d)
    own = torch.baddbmm(add_mask, qg, k.view(b * kvh, s, d).transpose(1, 2), alpha=d ** -0.5)
    if shared is None:
        o = torch.bmm(torch.softmax(own, dim=-1), v.view(b * kvh, s, d))
        return o.view(b, h, lq, d)
    ks, vs = shared
    p = ks.shape[1]
    qs = qg.view(b, kvh, gq, d).transpose(0, 1).reshape(kvh, b * gq, d)
    pre = torch.bmm(qs, ks.transpose(1, 2)).mul_(d ** -0.5)  # [kvh, b*gq, P]
    scores = torch.cat([pre.view(kvh, b, gq, p).transpose(0, 1),
                        own.view(b, kvh, gq, s)], dim=-1)
    probs = torch.softmax(scores, dim=-1)  # [b, kvh, gq, P + S]
    o = torch.bmm(probs[..., p:].reshape(b * kvh, gq, s), v.view(b * kvh, s, d))
    o_pre = torch.bmm(probs[..., :p].transpose(0, 1).reshape(kvh, b * gq, p), vs)
    o = o.view(b, kvh, gq, d) + o_pre.view(kvh, b, gq, d).transpose(0, 1)
    return o.reshape(b, h, lq, d)
