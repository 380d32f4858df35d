"""Triton twin of :func:`grammarserve_kernels.kv_indices.kv_indices_ref`: one program per request
copies its table row's first ``seq_len`` slots to its place in the flat index (SGLang's
``create_flashinfer_kv_indices_triton``, page size 1)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 512


@triton.jit
def _kv_indices_kernel(table_ptr, stride_table, rows_ptr, cu_ptr,  # type: ignore[no-untyped-def]
                       out_ptr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    row = tl.load(rows_ptr + b).to(tl.int64)
    start = tl.load(cu_ptr + b)
    n = tl.load(cu_ptr + b + 1) - start
    lane = tl.arange(0, BLOCK)
    for off in range(0, n, BLOCK):
        idx = off + lane
        live = idx < n
        slots = tl.load(table_ptr + row * stride_table + idx, mask=live, other=0)
        tl.store(out_ptr + start + idx, slots, mask=live)


def kv_indices_triton(table: torch.Tensor, rows: torch.Tensor, cu_k: torch.Tensor,
                      total: int) -> torch.Tensor:
    """See :func:`grammarserve_kernels.kv_indices.kv_indices`."""
    if table.stride(1) != 1:
        raise ValueError("the request-to-token table must be contiguous in its last dimension")
    out = torch.empty(total, dtype=table.dtype, device=table.device)
    if rows.numel():
        _kv_indices_kernel[(rows.numel(),)](table, table.stride(0), rows.contiguous(),
                                            cu_k.contiguous(), out, BLOCK=_BLOCK)
    return out
