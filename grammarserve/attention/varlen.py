"""Attention of a whole ragged batch in one variable-length call per layer (the CUDA backend).

Each request's K/V is gathered from the page-size-1 pool through the flat KV index
(:func:`grammarserve_kernels.kv_indices.kv_indices`, built on the device once per forward); then
one ``flash_attn_varlen`` call attends every new query to its own sequence, causal
bottom-right (query ``i`` of a request with ``p`` cached tokens sees keys ``0 .. p + i``). On
CUDA in fp16/bf16 that call is PyTorch's FlashAttention-2 kernel (``aten::_flash_attention_
forward``: GQA read in place, no score tensor, no mask). Elsewhere (CPU, fp32) the same
inputs go through a padded SDPA with the K/V heads expanded and a boolean mask, which CUDA runs
with its memory-efficient kernel (the reference the tests and the GPU smoke test compare to).

Nothing here reads a value back to the host: the index tensors are staged from host lists in one
copy (:mod:`grammarserve.attention.staging`), and token counts come from the batch's lists.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from grammarserve_kernels.kv_indices import kv_indices

from grammarserve.attention.backend import AttentionBackend
from grammarserve.attention.forward_batch import ForwardBatch
from grammarserve.attention.kv_pool import KVPool, ReqToTokenPool
from grammarserve.attention.staging import stage_int64

FLASH_DTYPES = (torch.float16, torch.bfloat16)


@dataclass
class VarlenMeta:
    """One forward's index tensors (shared by every layer)."""

    cu_q: torch.Tensor  # int32 [B + 1] cumulative new-token counts
    cu_k: torch.Tensor  # int32 [B + 1] cumulative sequence lengths
    max_q: int
    max_k: int
    kv_index: torch.Tensor  # int64 [sum(seq_len)] KV slots, request by request
    prefix: torch.Tensor  # int64 [B] cached tokens before each request's new ones
    extend: torch.Tensor  # int64 [B]
    seq: torch.Tensor  # int64 [B]
    num_tokens: int


def flash_usable(q: torch.Tensor) -> bool:
    """Whether :func:`varlen_attention` takes the FlashAttention kernel for ``q``."""
    return (q.device.type == "cuda" and q.dtype in FLASH_DTYPES and q.shape[-1] % 8 == 0
            and q.shape[-1] <= 256)


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: VarlenMeta, *,
                     window: int | None = None, use_flash: bool | None = None) -> torch.Tensor:
    """Causal (bottom-right) attention of ragged queries ``[T, H, d]`` over ragged keys
    ``[sum(seq_len), Hkv, d]``; returns ``[T, H, d]``. ``window``: sliding-window length
    (key ``j`` is seen by query position ``p`` when ``p - window < j <= p``)."""
    scale = q.shape[-1] ** -0.5
    if use_flash is None:
        use_flash = flash_usable(q)
    groups = q.shape[1] // k.shape[1]
    if meta.max_q == 1 and window is None and groups > 1:
        # NOTE: a decode batch: each KV head's query heads become that head's query rows
        # (FlashAttention's "seqlen_q ngroups swapped" trick, which its varlen entry point does
        # not do itself), so K/V are read once per KV head instead of once per query head.
        b, d, kv_heads = q.shape[0], q.shape[-1], k.shape[1]
        qs = q.view(b, kv_heads, groups, d).transpose(1, 2).reshape(b * groups, kv_heads, d)
        swapped = VarlenMeta(meta.cu_q * groups, meta.cu_k, groups, meta.max_k, meta.kv_index,
                             meta.prefix, meta.extend * groups, meta.seq, b * groups)
        out = _attend(qs, k, v, swapped, None, scale, use_flash, causal=False)
        return out.view(b, groups, kv_heads, d).transpose(1, 2).reshape(q.shape)
    return _attend(q, k, v, meta, window, scale, use_flash, causal=True)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: VarlenMeta,
            window: int | None, scale: float, use_flash: bool, *, causal: bool) -> torch.Tensor:
    if use_flash:
        return torch.ops.aten._flash_attention_forward(
            q.contiguous(), k.contiguous(), v.contiguous(), meta.cu_q, meta.cu_k, meta.max_q,
            meta.max_k, 0.0, causal, False, scale=scale,
            window_size_left=-1 if window is None else window - 1,
            window_size_right=0 if causal else -1)[0]
    return _padded_attention(q, k, v, meta, window, scale, causal)


def _padded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: VarlenMeta,
                      window: int | None, scale: float, causal: bool) -> torch.Tensor:
    """The reference: requests padded to ``[B, H, max_q | max_k, d]``, heads expanded (so CUDA's
    memory-efficient SDPA kernel takes it, which ``enable_gqa`` would not), a boolean mask
    (without ``causal``, every query of a request sees its whole sequence)."""
    dev = q.device
    b = meta.extend.numel()
    cu_q, cu_k = meta.cu_q.long(), meta.cu_k.long()
    qi = torch.arange(meta.max_q, device=dev)
    kj = torch.arange(meta.max_k, device=dev)
    q_rows = cu_q[:-1, None] + torch.minimum(qi[None], meta.extend[:, None] - 1)  # [B, Lq]
    k_rows = cu_k[:-1, None] + torch.minimum(kj[None], meta.seq[:, None] - 1)  # [B, S]
    q_pos = meta.prefix[:, None] + qi[None]  # [B, Lq] absolute position of each query
    mask = (kj[None, None] < meta.seq[:, None, None]).expand(b, meta.max_q, meta.max_k)
    if causal:
        mask = mask & (kj[None, None] <= q_pos[:, :, None])
    if window is not None:
        mask = mask & (kj[None, None] > q_pos[:, :, None] - window)
    groups = q.shape[1] // k.shape[1]
    qp = q[q_rows].transpose(1, 2)  # [B, H, Lq, d]
    kp = k[k_rows].transpose(1, 2).repeat_interleave(groups, dim=1)  # [B, H, S, d]
    vp = v[k_rows].transpose(1, 2).repeat_interleave(groups, dim=1)
    o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask[:, None], scale=scale)
    # Token t of request r sits at padded row r * max_q + (t - cu_q[r]).
    owner = torch.repeat_interleave(torch.arange(b, device=dev), meta.extend,
                                    output_size=meta.num_tokens)
    flat = owner * meta.max_q + torch.arange(meta.num_tokens, device=dev) - cu_q[:-1][owner]
    return o.transpose(1, 2).reshape(b * meta.max_q, *q.shape[1:])[flat]


class VarlenBackend(AttentionBackend):
    """One variable-length attention call per layer over the whole batch (prefill chunks,
    decode tokens and jump-forward spans alike); see the module docstring."""

    def __init__(self, pool: KVPool, req_to_token: ReqToTokenPool,
                 sliding_window: int | None = None) -> None:
        self.pool = pool
        self.req_to_token = req_to_token
        self.sliding_window = sliding_window
        self._batch: ForwardBatch | None = None
        self._meta: VarlenMeta | None = None

    def prepare(self, batch: ForwardBatch) -> None:
        seq, ext = batch.seq_lens, batch.extend_lens
        cu_q, cu_k = [0], [0]
        for n, s in zip(ext, seq):
            cu_q.append(cu_q[-1] + n)
            cu_k.append(cu_k[-1] + s)
        rows, prefix, ext_t, seq_t, cu_q_t, cu_k_t = stage_int64(
            [batch.req_pool_indices, batch.prefix_lens, ext, seq, cu_q, cu_k],
            batch.input_ids.device)
        self._batch = batch
        self._meta = VarlenMeta(
            cu_q_t.to(torch.int32), cu_k_t.to(torch.int32), max(ext), max(seq),
            kv_indices(self.req_to_token.table, rows, cu_k_t, cu_k[-1]), prefix, ext_t, seq_t,
            cu_q[-1])

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> torch.Tensor:
        if self._batch is None or self._meta is None:
            raise RuntimeError("AttentionBackend.prepare(batch) must be called before forward()")
        self.pool.write(layer, self._batch.out_cache_loc, k, v)
        idx = self._meta.kv_index
        kg = self.pool.k[layer].index_select(0, idx).to(q.dtype)
        vg = self.pool.v[layer].index_select(0, idx).to(q.dtype)
        return varlen_attention(q, kg, vg, self._meta, window=self.sliding_window)
