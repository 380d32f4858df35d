"""Attention over the token-slot KV pool, behind a backend seam.

A backend is prepared once per forward (index tensors and masks shared by all layers) and then
called per layer. ``TorchSDPABackend`` runs on any device with ``torch.nn.functional.
scaled_dot_product_attention``; a GPU backend (Triton / FlashInfer) plugs in behind the same ABC.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from grammarserve_kernels.decode_attn import HEAD_DIMS, attention_isa, decode_attention
from grammarserve_kernels.decode_stack import StackKV

from grammarserve.attention.cascade import (
    SharedPrefixKV,
    additive_mask,
    cascade_attention,
    matmul_attention,
)
from grammarserve.attention.forward_batch import ForwardBatch
from grammarserve.attention.kv_mirror import KVMirror
from grammarserve.attention.kv_pool import KVPool, ReqToTokenPool
from grammarserve.attention.prefill_kv import PrefillKV, mirror_split
from grammarserve.attention.row_mirror import RowMirror

# Requests with at most this many new tokens (decode steps, jump-forward spans) are attended
# together in one padded call; longer extends run one call each so no query padding is wasted.
SHORT_EXTEND = 16
# With the fused CPU kernel (RowMirror) the short group takes extends up to this long: a prefill
# on top of a cached prompt (the next request behind a shared few-shot prompt, a tool result) or
# a long jump-forward span then runs in the same one-call decode step as the decoding rows,
# instead of one padded SDPA group per request over K/V gathered from the pool every layer.
FUSED_EXTEND = 256
# Mirrored (decode) groups whose longest extend is at most this many queries attend with two
# batched matmuls instead of SDPA: CPU flash attention's cost grows with the padded query length,
# so one jump-forward span in the group made every row pay for it (2x at 4 queries, measured).
MATMUL_MAX_QUERIES = 8
# With ``prefill_dtype`` (bf16 where the linears' prefill is bf16) a causal group or lone chunk of
# this many queries attends in it: CPU flash attention in bf16 is ~2.6x fp32 (AMX; ~3e-3 error).
LOW_PRECISION_MIN_QUERIES = 256


class AttentionBackend(ABC):
    """Contract: ``prepare(batch)`` is called once before the layers run; then ``forward`` is
    called once per layer. ``forward`` first stores the new tokens' K/V in the pool at
    ``batch.out_cache_loc`` and then attends each new query to its request's whole sequence
    (prefix and new tokens, causal)."""

    @abstractmethod
    def prepare(self, batch: ForwardBatch) -> None: ...

    @abstractmethod
    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """q ``[T, heads, d]``, k/v ``[T, kv_heads, d]`` -> output ``[T, heads, d]``."""

    def stack_kv(self) -> StackKV | None:
        """The prepared batch's K/V for a one-call decoder stack, or None (the default): the
        layers run one by one."""
        return None


@dataclass
class _CausalGroup:
    """One request with no cached prefix: plain causal attention over its own new tokens."""

    rows: slice
    slots: torch.Tensor  # [n]


@dataclass
class _PaddedGroup:
    """Several requests padded to a common query length and key length."""

    q_rows: torch.Tensor  # [B, Lq] row of each query (padding repeats a valid row)
    # The torch paths' inputs (None for a RowMirror group: the fused kernel needs neither)
    kv_slots: torch.Tensor | None  # [B, S] KV slot of each key (padding = slot 0)
    mask: torch.Tensor | None  # [B, 1, Lq, S] True where attention is allowed
    valid: torch.Tensor  # [N] flat indices into B*Lq of real queries
    out_rows: torch.Tensor  # [N] batch rows those queries belong to
    mirror_b: torch.Tensor | None = None  # [N] group row of each new token, when mirrored
    mirror_pos: torch.Tensor | None = None  # [N] its position
    cap_mask: torch.Tensor | None = None  # [B, Lq, S_cap] matmul path: keys allowed per query
    add_mask: torch.Tensor | None = None  # [B*kv_heads, group*Lq, S_cap], built on first layer
    base: int = 0  # positions before this are the group's shared prefix (cascade.py)
    own_len: torch.Tensor | None = None  # [N] mirror keys each query sees (fused kernel)
    prefill_seq: int | None = None  # one request whose K/V PrefillKV holds (prefill_kv.py)


class TorchSDPABackend(AttentionBackend):
    """Attention with torch SDPA; K/V gathered from the pool by slot index.

    With ``decode_kernel`` (and the kernel built for this CPU), mirrored decode groups in fp32
    attend with the fused C++ kernel (``kernels/decode_attn_cpu.cpp``) instead of the batched
    matmuls of ``cascade.py``: the same result, to float rounding. With ``decode_stack`` too,
    :meth:`stack_kv` offers such a batch to the model's one-call decoder stack
    (``kernels/decode_stack_cpu.cpp``).
    """

    def __init__(self, pool: KVPool, req_to_token: ReqToTokenPool,
                 sliding_window: int | None = None, mirror_tokens: int | None = None,
                 decode_kernel: bool = True, decode_stack: bool = True,
                 prefill_dtype: torch.dtype | None = None) -> None:
        self.pool = pool
        self.prefill_dtype = prefill_dtype
        # NOTE: with the kernel, every mirrored group in fp32 takes it (any span length), so the
        # mirror can keep K in the kernel's tiled layout.
        self.decode_kernel = (decode_kernel and sliding_window is None
                              and pool.k[0].device.type == "cpu" and attention_isa() is not None
                              and pool.dtype == torch.float32 and pool.k[0].shape[-1] in HEAD_DIMS)
        self.decode_stack = decode_stack and self.decode_kernel
        self.req_to_token = req_to_token
        self.sliding_window = sliding_window
        self.mirror: KVMirror | RowMirror | None = None
        if mirror_tokens and self.decode_kernel:
            self.mirror = RowMirror(pool, req_to_token.table, mirror_tokens,
                                    req_to_token.max_context)
        elif mirror_tokens:
            self.mirror = KVMirror(pool, mirror_tokens, req_to_token.max_context)
        self.shared = SharedPrefixKV(pool)
        # A request attended alone behind a long prefix (a chunked prompt) reads its K/V from
        # a contiguous per-request copy instead of a gather from the pool every layer, every
        # step; bounded like the mirror (off without one).
        self.prefill_kv: PrefillKV | None = None
        if mirror_tokens:
            self.prefill_kv = PrefillKV(pool, req_to_token.table,
                                        min(mirror_tokens, req_to_token.max_context),
                                        req_to_token.max_context)
        self._batch: ForwardBatch | None = None
        self._groups: list[_CausalGroup | _PaddedGroup] = []

    def prepare(self, batch: ForwardBatch) -> None:
        """Group the batch's requests: prompts with no prefix (causal), the short group (decode
        tokens and spans up to the limit, one mirrored call) and requests attended alone (long
        extends, and members that would push the decode mirror past its budget: a late chunk
        of a long prompt; these read :class:`PrefillKV` where it has room)."""
        self._batch = batch
        self._groups = []
        short: list[int] = []
        alone: list[int] = []
        limit = FUSED_EXTEND if isinstance(self.mirror, RowMirror) else SHORT_EXTEND
        for i, (start, p, n) in enumerate(zip(batch.starts, batch.prefix_lens, batch.extend_lens)):
            window_ok = self.sliding_window is None or n <= self.sliding_window
            if p == 0 and n > 1 and window_ok:
                rows = slice(start, start + n)
                self._groups.append(_CausalGroup(rows, batch.out_cache_loc[rows]))
            elif n <= limit:
                short.append(i)
            else:
                alone.append(i)
        if short and self.mirror is not None and self.prefill_kv is not None:
            apart = mirror_split([batch.prefix_lens[i] + batch.extend_lens[i] for i in short],
                                 [batch.prefix_lens[i] for i in short],
                                 [batch.extend_lens[i] for i in short],
                                 [batch.seq_ids[i] in self.prefill_kv.entries for i in short],
                                 torch.tensor([batch.req_pool_indices[i] for i in short]),
                                 self.req_to_token.table, self.mirror.max_tokens)
            alone += [short[j] for j in apart]
            short = [i for j, i in enumerate(short) if j not in apart]
        if self.prefill_kv is not None:
            self.prefill_kv.begin([batch.seq_ids[i] for i in range(batch.batch_size)
                                   if i not in alone])
        for i in alone:
            self._groups.append(self._alone(batch, i))
        if short:
            base = 0
            table_rows = torch.tensor([batch.req_pool_indices[i] for i in short])
            if self.sliding_window is None and batch.input_ids.device.type == "cpu":
                base = self.shared.plan(self.req_to_token.table[
                    table_rows, :min(batch.prefix_lens[i] for i in short)])
            seq_ids = [batch.seq_ids[i] for i in short]
            prefix = [batch.prefix_lens[i] for i in short]
            extend = [batch.extend_lens[i] for i in short]
            mirror_rows: list[int] | None = None
            if isinstance(self.mirror, RowMirror):
                mirror_rows = self.mirror.plan(seq_ids, prefix, extend, table_rows, base=base)
                mirrored = mirror_rows is not None
            else:
                mirrored = self.mirror is not None and self.mirror.plan(
                    seq_ids, prefix, extend, base=base)
                if self.mirror is not None and mirrored and self.mirror.rebuild:
                    self.shared.invalidate()
            self._groups.append(self._padded(batch, short, mirrored=mirrored,
                                             base=base if mirrored else 0, rows=mirror_rows))

    def _alone(self, batch: ForwardBatch, i: int) -> _PaddedGroup:
        """Request ``i`` attended by itself: its K/V from :class:`PrefillKV` where it has a
        prefix and fits there, else gathered from the pool."""
        g = self._padded(batch, [i])
        p, n = batch.prefix_lens[i], batch.extend_lens[i]
        if self.prefill_kv is not None and p > 0 and self.prefill_kv.plan(
                batch.seq_ids[i], batch.req_pool_indices[i], p, n):
            g.prefill_seq = batch.seq_ids[i]
        return g

    def _padded(self, batch: ForwardBatch, members: list[int], *,
                mirrored: bool = False, base: int = 0,
                rows: list[int] | None = None) -> _PaddedGroup:
        """``rows``: the members' rows of a :class:`RowMirror` (else row b is member b)."""
        device = batch.input_ids.device
        starts, prefix, extend = batch.starts, batch.prefix_lens, batch.extend_lens
        lq = max(extend[i] for i in members)
        if lq == 1 and rows is not None and mirrored:
            return self._decode_group(batch, members, rows, base)
        s = max(prefix[i] + extend[i] for i in members)
        s_slots = self.mirror.capacity if mirrored and self.mirror is not None else s
        q_off = torch.arange(lq, device=device)
        start_t = torch.tensor([starts[i] for i in members], device=device)
        ext_t = torch.tensor([extend[i] for i in members], device=device)
        pre_t = torch.tensor([prefix[i] for i in members], device=device)
        real = q_off[None, :] < ext_t[:, None]  # [B, Lq]
        q_rows = start_t[:, None] + torch.minimum(q_off[None, :], ext_t[:, None] - 1)
        q_pos = pre_t[:, None] + q_off[None, :]  # [B, Lq] absolute position of each query
        valid = real.flatten().nonzero().squeeze(1)
        kv_slots = mask = None
        if rows is None:  # NOTE: [B, Lq, S] masks: skipped for the fused kernel's groups
            rows_idx = torch.tensor([batch.req_pool_indices[i] for i in members], device=device)
            kv_slots = self.req_to_token.table[rows_idx, base:base + s_slots]
            k_pos = torch.arange(s, device=device)
            mask = k_pos[None, None, :] <= q_pos[:, :, None]
            if self.sliding_window is not None:
                mask = mask & (k_pos[None, None, :] > q_pos[:, :, None] - self.sliding_window)
            mask = mask[:, None]
        m_b = m_pos = cap_mask = None
        if mirrored:
            b_idx = (torch.tensor(rows, device=device) if rows is not None else
                     torch.arange(len(members), device=device))[:, None].expand_as(q_pos)
            m_b, m_pos = b_idx.flatten()[valid], q_pos.flatten()[valid] - base
            if rows is None and (lq <= MATMUL_MAX_QUERIES or base) and device.type == "cpu":
                # Over the whole capacity, so the mirror is read in place (k_pos <= q_pos
                # already excludes every position past a row's own length).
                k_cap = base + torch.arange(s_slots, device=device)
                cap_mask = k_cap[None, None, :] <= q_pos[:, :, None]
                if self.sliding_window is not None:
                    cap_mask &= k_cap[None, None, :] > q_pos[:, :, None] - self.sliding_window
        return _PaddedGroup(q_rows, kv_slots, mask, valid, q_rows.flatten()[valid],
                            m_b, m_pos, cap_mask, base=base)

    @staticmethod
    def _decode_group(batch: ForwardBatch, members: list[int], rows: list[int],
                      base: int) -> _PaddedGroup:
        """:meth:`_padded` of a :class:`RowMirror` group where every member brings one token
        (a plain decode step): the same group from one small tensor instead of ~15 ops."""
        device = batch.input_ids.device
        t = torch.tensor([[batch.starts[i] for i in members],
                          [batch.prefix_lens[i] - base for i in members], rows], device=device)
        start_t, m_pos, m_b = t[0], t[1], t[2]
        return _PaddedGroup(start_t[:, None], None, None,
                            torch.arange(len(members), device=device), start_t, m_b, m_pos,
                            None, base=base)

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        if self._batch is None:
            raise RuntimeError("AttentionBackend.prepare(batch) must be called before forward()")
        self.pool.write(layer, self._batch.out_cache_loc, k, v)
        out = torch.empty_like(q)
        for g in self._groups:
            if isinstance(g, _CausalGroup):
                self._causal(layer, q, g, out)
            elif g.prefill_seq is not None:
                self._prefill_sdpa(layer, q, g, out)
            elif g.mirror_b is None or self.mirror is None:
                self._padded_sdpa(layer, q, g, out)
            elif isinstance(self.mirror, RowMirror):
                out[g.out_rows] = self._fused(layer, q, g)
            elif g.cap_mask is None:
                self._mirrored_sdpa(layer, q, g, out)
            elif g.base:
                self._cascade(layer, q, g, out)
            else:
                self._mirrored_matmul(layer, q, g, out)
        return out

    def stack_kv(self) -> StackKV | None:
        """For a prepared batch that is one mirrored decode group attended by the fused kernel
        (every request a decode token or a short span, fp32 KV): the K/V locations of every
        layer for :class:`~grammarserve_kernels.decode_stack.DecodeStack`, with the mirror and
        the shared prefix brought up to date for the old positions (the kernel writes the new
        tokens). None otherwise: the layers then run one by one through :meth:`forward`."""
        if not self.decode_stack or len(self._groups) != 1 or self.mirror is None:
            return None
        g = self._groups[0]
        if not isinstance(g, _PaddedGroup) or g.mirror_b is None or g.mirror_pos is None:
            return None
        if not isinstance(self.mirror, RowMirror):
            return None
        shared = [self.shared.kv(layer) for layer in range(len(self.pool.k))] if g.base else []
        assert self._batch is not None
        return StackKV(self.pool.k, self.pool.v, self.mirror.k, self.mirror.v,
                       [k for k, _ in shared], [v for _, v in shared],
                       self._batch.out_cache_loc, g.mirror_b, g.mirror_pos,
                       key=(self.pool, self.mirror.generation, self.shared.generation, g.base))

    def _causal(self, layer: int, q: torch.Tensor, g: _CausalGroup, out: torch.Tensor) -> None:
        """A request with no cached prefix: causal SDPA over its own new tokens."""
        k_buf, v_buf = self.pool.k[layer], self.pool.v[layer]
        dt = self._dtype(q, g.slots.shape[0])
        qg = q[g.rows].to(dt).transpose(0, 1)[None]  # [1, H, n, d]
        kg = k_buf.index_select(0, g.slots).to(dt).transpose(0, 1)[None]
        vg = v_buf.index_select(0, g.slots).to(dt).transpose(0, 1)[None]
        o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, enable_gqa=True)
        out[g.rows] = o[0].transpose(0, 1)

    def _padded_sdpa(self, layer: int, q: torch.Tensor, g: _PaddedGroup,
                     out: torch.Tensor) -> None:
        """Padded SDPA over K/V gathered from the pool by slot (no mirror)."""
        k_buf, v_buf = self.pool.k[layer], self.pool.v[layer]
        assert g.kv_slots is not None
        kg = _gather(k_buf, g.kv_slots).to(q.dtype).transpose(1, 2)  # [B, Hkv, S, d]
        vg = _gather(v_buf, g.kv_slots).to(q.dtype).transpose(1, 2)
        self._sdpa(q, g, kg, vg, out)

    def _prefill_sdpa(self, layer: int, q: torch.Tensor, g: _PaddedGroup,
                      out: torch.Tensor) -> None:
        """A request alone: SDPA over its contiguous K/V in :class:`PrefillKV` (this step's
        new tokens appended first), the same keys and mask as :meth:`_padded_sdpa`."""
        assert self.prefill_kv is not None and g.prefill_seq is not None and self._batch is not None
        k, v = self.prefill_kv.append(layer, g.prefill_seq, self._batch.out_cache_loc[g.out_rows])
        dt = self._dtype(q, g.q_rows.shape[1])
        self._sdpa(q, g, k[None].to(dt), v[None].to(dt), out)

    def _dtype(self, q: torch.Tensor, queries: int) -> torch.dtype:
        """The dtype a group of ``queries`` queries attends in (LOW_PRECISION_MIN_QUERIES)."""
        long = self.prefill_dtype is not None and queries >= LOW_PRECISION_MIN_QUERIES
        return self.prefill_dtype if long and self.prefill_dtype else q.dtype

    def _mirror_kv(self, layer: int, g: _PaddedGroup) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the group's new K/V to the mirror; its ``[B, Hkv, S_cap, d]`` K and V."""
        assert self._batch is not None and isinstance(self.mirror, KVMirror)
        assert g.mirror_b is not None and g.mirror_pos is not None and g.kv_slots is not None
        return self.mirror.update(layer, g.kv_slots, g.mirror_b, g.mirror_pos,
                                  self._batch.out_cache_loc[g.out_rows])

    def _mirrored_sdpa(self, layer: int, q: torch.Tensor, g: _PaddedGroup,
                       out: torch.Tensor) -> None:
        """Padded SDPA reading K/V from the decode mirror (longer query spans)."""
        km, vm = self._mirror_kv(layer, g)
        assert g.mask is not None
        s = g.mask.shape[-1]
        self._sdpa(q, g, km[:, :, :s].to(q.dtype), vm[:, :, :s].to(q.dtype), out)

    def _mirrored_matmul(self, layer: int, q: torch.Tensor, g: _PaddedGroup,
                         out: torch.Tensor) -> None:
        """Short decode group: two batched matmuls over the whole mirror capacity."""
        km, vm = self._mirror_kv(layer, g)
        add_mask = self._add_mask(g, km, q)
        o = matmul_attention(q[g.q_rows].transpose(1, 2), km.to(q.dtype), vm.to(q.dtype),
                             add_mask)
        out[g.out_rows] = o.transpose(1, 2).flatten(0, 1)[g.valid]

    def _cascade(self, layer: int, q: torch.Tensor, g: _PaddedGroup, out: torch.Tensor) -> None:
        """Decode group behind a shared prefix: the prefix scored once, each row's suffix apart
        (cascade.py)."""
        km, vm = self._mirror_kv(layer, g)
        kt, vs = self.shared.kv(layer)
        add_mask = self._add_mask(g, km, q)
        out[g.out_rows] = cascade_attention(
            q[g.q_rows].transpose(1, 2), g.valid, km.to(q.dtype), vm.to(q.dtype), add_mask,
            (kt.to(q.dtype), vs.to(q.dtype)))

    def _fused(self, layer: int, q: torch.Tensor, g: _PaddedGroup) -> torch.Tensor:
        """A mirrored group's real queries through the fused kernel, over the shared prefix (if
        the group has one) and each row's mirror up to the query's position."""
        assert g.mirror_b is not None and g.mirror_pos is not None and self._batch is not None
        assert isinstance(self.mirror, RowMirror)
        kmt, vm = self.mirror.write_new(layer, g.mirror_b, g.mirror_pos,
                                        self._batch.out_cache_loc[g.out_rows])
        kt, vs = self.shared.kv(layer) if g.base else (q.new_empty(0), q.new_empty(0))
        if g.own_len is None:
            g.own_len = g.mirror_pos + 1  # a query sees its row's mirror up to its position
        qr = (q[g.out_rows].float() * q.shape[-1] ** -0.5).contiguous()
        return decode_attention(qr, kt, vs, kmt, vm, g.mirror_b, g.own_len).to(q.dtype)

    @staticmethod
    def _add_mask(g: _PaddedGroup, km: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """The group's additive mask for the matmul paths, built on the first layer only."""
        if g.add_mask is None:
            assert g.cap_mask is not None
            g.add_mask = additive_mask(g.cap_mask, km.shape[1], q.shape[1], q.dtype)
        return g.add_mask

    @staticmethod
    def _sdpa(q: torch.Tensor, g: _PaddedGroup, kg: torch.Tensor, vg: torch.Tensor,
              out: torch.Tensor) -> None:
        """Masked SDPA of the group's padded queries; real query rows are written to ``out``."""
        assert g.mask is not None  # (None would be no mask at all)
        qg = q[g.q_rows].to(kg.dtype).transpose(1, 2)  # [B, H, Lq, d], in the keys' dtype
        o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=g.mask, enable_gqa=True)
        out[g.out_rows] = o.transpose(1, 2).flatten(0, 1)[g.valid].to(out.dtype)  # real rows

def _gather(buf: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``buf[slots]`` for 2-D ``slots``; index_select is several times faster than indexing."""
    return buf.index_select(0, slots.flatten()).view(*slots.shape, *buf.shape[1:])
