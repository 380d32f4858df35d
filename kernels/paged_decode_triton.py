"""Triton twin of :func:`grammarserve_kernels.paged_decode.paged_decode_ref`.

One program per (request, KV head) holds that head's group of query heads (padded to 16 rows
for ``tl.dot``) and walks the sequence in blocks of ``BLOCK_N`` slots read from the table row,
with an online softmax in fp32 (K/V are widened to fp32 as they are loaded: exact IEEE dots
for an fp32 pool, TF32 ones for bf16/fp16, whose inputs TF32 holds exactly). No split over the sequence: at batch 1 only ``kv_heads``
programs run, which suits short and medium contexts (what decode benchmarks here use).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_decode_kernel(q_ptr, k_ptr, v_ptr, table_ptr, rows_ptr, seq_ptr,  # type: ignore[no-untyped-def]
                         out_ptr, scale, stride_qb, stride_qh, stride_ks, stride_kh,
                         stride_vs, stride_vh, stride_table, stride_ob, stride_oh,
                         GROUP: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr,
                         BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    row = tl.load(rows_ptr + b).to(tl.int64)
    seq_len = tl.load(seq_ptr + b)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)
    g_live = offs_g < GROUP
    heads = kvh * GROUP + offs_g
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_live[:, None], other=0.0).to(tl.float32)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        pos = start + offs_n
        live = pos < seq_len
        slots = tl.load(table_ptr + row * stride_table + pos, mask=live, other=0)
        k = tl.load(k_ptr + slots[:, None] * stride_ks + kvh * stride_kh + offs_d[None, :],
                    mask=live[:, None], other=0.0).to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [BLOCK_G, BLOCK_N]
        s = tl.where(live[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + slots[:, None] * stride_vs + kvh * stride_vh + offs_d[None, :],
                    mask=live[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=g_live[:, None])


def paged_decode_triton(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                        table: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor,
                        scale: float) -> torch.Tensor:
    """See :func:`grammarserve_kernels.paged_decode.paged_decode_attention`."""
    b, h, d = q.shape
    kv_heads = k_pool.shape[1]
    if d & (d - 1) or d < 16:
        raise ValueError(f"the Triton decode kernel needs a power-of-two head_dim >= 16, got {d}")
    for t in (q, k_pool, v_pool, table):
        if t.stride(-1) != 1:
            raise ValueError("q, the pool and the table must be contiguous in the last dim")
    group = h // kv_heads
    out = torch.empty_like(q)
    if b:
        _paged_decode_kernel[(b, kv_heads)](
            q, k_pool, v_pool, table, rows, seq_lens, out, scale, q.stride(0), q.stride(1),
            k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
            table.stride(0), out.stride(0), out.stride(1), GROUP=group,
            BLOCK_G=max(16, triton.next_power_of_2(group)), D=d, BLOCK_N=64,
            PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=4)
    return out
