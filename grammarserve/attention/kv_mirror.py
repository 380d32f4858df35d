"""A contiguous, step-to-step copy of the K/V of the short-extend (decode) group.

Gathering every decoding request's whole context from the token-slot pool costs a full copy of
the batch's KV per layer per step; on a CPU that copy, not the attention math, dominates decode.
While the set of decoding requests stays the same, the mirror keeps their K/V contiguous and only
appends each step's new tokens; any change of membership rebuilds it with one gather. The pool
stays the source of truth (the radix cache and new requests read it); the mirror is bounded by a
token budget and skipped when the group does not fit.
"""

from __future__ import annotations

import torch

from grammarserve.attention.kv_pool import KVPool

HEADROOM = 64  # extra positions per row so that steady decoding rarely forces a rebuild


class KVMirror:
    """Per-layer ``[B, kv_heads, S_cap, head_dim]`` K and V buffers for one group of sequences
    (head-major: SDPA reads it ~25% faster than a transposed token-major view). Used by the torch
    attention paths; the fused CPU kernel has its own (``row_mirror.py``)."""

    def __init__(self, pool: KVPool, max_tokens: int, max_context: int) -> None:
        self.pool = pool
        self.max_tokens = max_tokens
        self.max_context = max_context
        self._seq_ids: list[int] = []
        self._seq_lens: list[int] = []
        self._cap = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.rebuild = True  # set by plan(): gather from the pool this step
        self.rebuilds = 0
        self.base = 0  # positions before ``base`` are not mirrored (a shared prefix, cascade.py)

    def plan(self, seq_ids: list[int], prefix_lens: list[int], extend_lens: list[int],
             base: int = 0) -> bool:
        """Decide for this step; the mirror holds positions ``base ..`` of each sequence.
        Returns False when the group is too big to mirror."""
        seq_lens = [p + e - base for p, e in zip(prefix_lens, extend_lens)]
        same = (seq_ids == self._seq_ids and base == self.base
                and [p - base for p in prefix_lens] == self._seq_lens
                and max(seq_lens) <= self._cap and min(seq_ids) >= 0)
        self.base = base
        self._seq_ids, self._seq_lens = list(seq_ids), seq_lens
        if same:
            self.rebuild = False
            return True
        cap = min(max(seq_lens) + HEADROOM, self.max_context - base)
        if len(seq_ids) * cap > self.max_tokens:
            self._seq_ids, self._cap = [], 0
            return False
        self.rebuild, self._cap = True, cap
        self.rebuilds += 1
        return True

    @property
    def capacity(self) -> int:
        return self._cap

    def update(self, layer: int, kv_slots_full: torch.Tensor, new_b: torch.Tensor,
               new_pos: torch.Tensor, new_slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Bring layer ``layer`` up to date and return its K, V ``[B, h, S_cap, d]``.

        ``kv_slots_full`` ``[B, S_cap]``: slots of every mirrored position (0 = padding), used to
        rebuild; this step's new tokens sit in rows ``new_b`` at mirror positions ``new_pos``
        (absolute position - ``base``), with pool slots
        ``new_slots`` (all ``[N]``).
        """
        k_pool, v_pool = self.pool.k[layer], self.pool.v[layer]
        if self.rebuild:
            b, s = kv_slots_full.shape
            flat = kv_slots_full.flatten()
            k = k_pool.index_select(0, flat).view(b, s, *k_pool.shape[1:]).transpose(1, 2)
            v = v_pool.index_select(0, flat).view(b, s, *v_pool.shape[1:]).transpose(1, 2)
            k, v = k.contiguous(), v.contiguous()
            if layer < len(self.k):
                self.k[layer], self.v[layer] = k, v
            else:
                self.k.append(k)
                self.v.append(v)
            return k, v
        k, v = self.k[layer], self.v[layer]
        k[new_b, :, new_pos] = k_pool.index_select(0, new_slots)
        v[new_b, :, new_pos] = v_pool.index_select(0, new_slots)
        return k, v
