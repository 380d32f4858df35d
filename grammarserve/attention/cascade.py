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

from grammarserve.attention.kv_pool import KVPool

MIN_SHARED = 64  # shorter common prefixes are attended per row (not worth a separate part)


class SharedPrefixKV:
    """Per-layer K (transposed: ``[kv_heads, head_dim, P]``) and V (``[kv_heads, P, head_dim]``)
    of the prefix shared by a group's rows.

    NOTE: the copy is reused across steps only while the KV mirror is (same requests, in the
    same order): those requests hold the radix-cache locks on the shared slots all along, so the
    slots cannot have been freed and rewritten. Any mirror rebuild calls :meth:`invalidate`.
    """

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self.length = 0
        self._slots: torch.Tensor | None = None
        self._stale = True
        self.generation = object()  # renewed whenever the tensors in k and v will be replaced
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
        slots = rows[0, :p].clone() if p else None
        if slots is None:
            if self._slots is not None:
                self.invalidate()  # NOTE: not on every step without one: a new generation
                # makes the decode stack rebuild its per-layer address tables
        elif self._slots is None or not torch.equal(slots, self._slots):
            self.invalidate()  # another prefix (same length or not): gather it again
        self.length, self._slots = p, slots
        return p

    def invalidate(self) -> None:
        self._stale = True
        self.generation = object()  # the next kv() replaces the tensors

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The shared K (transposed), V of ``layer``, gathered from the pool when stale."""
        if self._stale or layer >= len(self.k):
            assert self._slots is not None
            k = self.pool.k[layer].index_select(0, self._slots).permute(1, 2, 0).contiguous()
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


def matmul_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     add_mask: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention: q ``[B, H, Lq, d]``; k/v ``[B, kv_heads, S, d]`` contiguous,
    masked by ``add_mask``. Returns ``[B, H, Lq, d]``. Each K/V head is read once for all the
    query heads that share it."""
    b, h, lq, d = q.shape
    kvh, s = k.shape[1], k.shape[2]
    qg = q.reshape(b * kvh, (h // kvh) * lq, d)
    scores = torch.baddbmm(add_mask, qg, k.view(b * kvh, s, d).transpose(1, 2), alpha=d ** -0.5)
    o = torch.bmm(torch.softmax(scores, dim=-1), v.view(b * kvh, s, d))
    return o.view(b, h, lq, d)


def cascade_attention(q: torch.Tensor, valid: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      add_mask: torch.Tensor,
                      shared: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Like :func:`matmul_attention`, plus ``shared`` k (transposed: ``[kv_heads, d, P]``) and v
    (``[kv_heads, P, d]``): keys before
    every row's own, visible to every query. Returns ``[N, H, d]`` for the real queries only
    (``valid``: their flat indices into ``B*Lq``).

    The shared part, the bulk of the keys, is scored once for the real queries (no padding to
    the longest jump-forward span); each row's own part is scored padded; the two partial
    softmaxes are merged by their maxima and sums.
    """
    b, h, lq, d = q.shape
    kvh, s = k.shape[1], k.shape[2]
    group = h // kvh
    scale = d ** -0.5
    # Each row's own keys: [B*kvh, group*Lq, S] -> per real query [N, kvh, group, ...].
    own = torch.baddbmm(add_mask, q.reshape(b * kvh, group * lq, d),
                        k.view(b * kvh, s, d).transpose(1, 2), alpha=scale)
    m_own = own.amax(-1, keepdim=True)
    e_own = own.sub_(m_own).exp_()
    l_own = e_own.sum(-1, keepdim=True)
    o_own = torch.bmm(e_own, v.view(b * kvh, s, d))

    def per_query(x: torch.Tensor) -> torch.Tensor:  # [B*kvh, group*Lq, c] -> [N, kvh, group, c]
        c = x.shape[-1]
        return x.view(b, kvh, group, lq, c).permute(0, 3, 1, 2, 4).reshape(
            b * lq, kvh, group, c)[valid]

    o_own, m_own, l_own = per_query(o_own), per_query(m_own), per_query(l_own)
    # The shared keys, once for the N real queries: [kvh, N*group, P].
    kt, vs = shared
    n = valid.numel()
    qs = q.permute(0, 2, 1, 3).reshape(b * lq, h, d)[valid].view(n, kvh, group, d)
    pre = torch.bmm(qs.permute(1, 0, 2, 3).reshape(kvh, n * group, d), kt)
    pre.mul_(scale)
    m_pre = pre.amax(-1, keepdim=True)
    e_pre = pre.sub_(m_pre).exp_()
    l_pre = e_pre.sum(-1, keepdim=True)
    o_pre = torch.bmm(e_pre, vs)

    def from_shared(x: torch.Tensor) -> torch.Tensor:  # [kvh, N*group, c] -> [N, kvh, group, c]
        return x.view(kvh, n, group, x.shape[-1]).transpose(0, 1)

    o_pre, m_pre, l_pre = from_shared(o_pre), from_shared(m_pre), from_shared(l_pre)
    m = torch.maximum(m_own, m_pre)
    a_own, a_pre = (m_own - m).exp_(), (m_pre - m).exp_()
    o = (o_own * a_own + o_pre * a_pre) / (l_own * a_own + l_pre * a_pre)
    return o.reshape(n, h, d)
