"""Decode attention read in place from the page-size-1 KV pool (the CUDA-graph decode path).

Each request has one new query per head; it attends to the whole of its sequence, whose KV slots
are ``table[row, :seq_len]``. Nothing is gathered: the kernel reads K/V at the slots (as SGLang's
Triton ``decode_attention_fwd``), so a decode step has no shape that changes with the context
and can be captured in a CUDA graph. Triton on CUDA tensors; the torch reference (which gathers)
elsewhere.
"""

from __future__ import annotations

import torch


def paged_decode_ref(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                     table: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """Torch reference: gather each request's K/V (padded to the longest) and attend in fp32."""
    b, h, d = q.shape
    kv_heads = k_pool.shape[1]
    longest = int(seq_lens.max()) if b else 0
    slots = table[rows, :longest]  # [B, L]
    k = k_pool[slots].float()  # [B, L, Hkv, d]
    v = v_pool[slots].float()
    qg = q.float().view(b, kv_heads, h // kv_heads, d)
    scores = torch.einsum("bkgd,blkd->bkgl", qg, k) * scale
    live = torch.arange(longest, device=q.device)[None, :] < seq_lens[:, None]  # [B, L]
    scores = scores.masked_fill(~live[:, None, None, :], float("-inf"))
    out = torch.einsum("bkgl,blkd->bkgd", scores.softmax(-1), v)
    return out.reshape(b, h, d).to(q.dtype)


def paged_decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                           table: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor,
                           scale: float, *, backend: str = "auto") -> torch.Tensor:
    """One query per request and head over its cached sequence.

    Parameters
    ----------
    q:
        ``[B, heads, d]``.
    k_pool, v_pool:
        One layer of the pool, ``[slots, kv_heads, d]`` (``heads`` a multiple of ``kv_heads``).
    table, rows, seq_lens:
        The request-to-token table (int64 ``[R, C]``), each request's row and sequence length
        (int64 ``[B]``, at least 1; the query is the sequence's last token).
    backend:
        ``"auto"`` (Triton on CUDA tensors, torch elsewhere), ``"torch"`` or ``"triton"`` (on
        CPU tensors it needs ``TRITON_INTERPRET=1``).

    Returns
    -------
    torch.Tensor
        ``[B, heads, d]`` in ``q``'s dtype (fp32 accumulation).
    """
    if q.dim() != 3 or q.shape[1] % k_pool.shape[1] or rows.shape != seq_lens.shape:
        raise ValueError(f"q must be [B, heads, d] with heads a multiple of the pool's kv heads, "
                         f"rows and seq_lens [B]; got q {tuple(q.shape)}, pool "
                         f"{tuple(k_pool.shape)}, rows {tuple(rows.shape)}")
    if backend == "triton" or (backend == "auto" and q.device.type == "cuda"):
        from grammarserve_kernels.paged_decode_triton import paged_decode_triton

        return paged_decode_triton(q, k_pool, v_pool, table, rows, seq_lens, scale)
    if backend not in ("auto", "torch"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    return paged_decode_ref(q, k_pool, v_pool, table, rows, seq_lens, scale)
