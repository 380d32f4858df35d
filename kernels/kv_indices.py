"""The flat KV-slot index of a ragged batch, read from the request-to-token table.

For request ``b`` of a batch, ``table[rows[b], :seq_len_b]`` lists the KV slots of its whole
sequence; attention over a page-size-1 pool needs them back to back (``[sum(seq_len)]``, request
``b`` at ``cu_k[b] : cu_k[b + 1]``), as FlashInfer's ``kv_indices`` or SGLang's
``create_flashinfer_kv_indices_triton``. Built on the device, without a host round trip: the
Triton kernel on CUDA, the torch reference (also the CPU path) elsewhere.
"""

from __future__ import annotations

import torch


def kv_indices_ref(table: torch.Tensor, rows: torch.Tensor, cu_k: torch.Tensor,
                   total: int) -> torch.Tensor:
    """Torch reference: ``cat([table[rows[b], :cu_k[b+1] - cu_k[b]] for b])`` as one gather.

    ``total`` must equal ``cu_k[-1]`` (the caller knows it on the host: passing it keeps
    ``repeat_interleave`` from reading it back from the device).
    """
    lens = cu_k[1:] - cu_k[:-1]
    owner = torch.repeat_interleave(torch.arange(rows.numel(), device=rows.device), lens,
                                    output_size=total)
    pos = torch.arange(total, device=rows.device) - cu_k[:-1][owner]
    return table[rows[owner], pos]


def kv_indices(table: torch.Tensor, rows: torch.Tensor, cu_k: torch.Tensor, total: int, *,
               backend: str = "auto") -> torch.Tensor:
    """The batch's KV slots back to back (int64 ``[total]``).

    Parameters
    ----------
    table:
        int64 ``[max_reqs, max_context]`` request-to-token table.
    rows:
        int64 ``[B]``: each request's table row.
    cu_k:
        int64 ``[B + 1]``: cumulative sequence lengths (``cu_k[0] == 0``).
    total:
        ``cu_k[-1]``, known on the host.
    backend:
        ``"auto"`` (Triton on CUDA tensors, torch elsewhere), ``"torch"`` or ``"triton"`` (on
        CPU tensors it needs ``TRITON_INTERPRET=1``).
    """
    if rows.dim() != 1 or cu_k.shape != (rows.numel() + 1,):
        raise ValueError(f"rows must be [B] and cu_k [B + 1]; got {tuple(rows.shape)} and "
                         f"{tuple(cu_k.shape)}")
    if backend == "triton" or (backend == "auto" and table.device.type == "cuda"):
        from grammarserve_kernels.kv_indices_triton import kv_indices_triton

        return kv_indices_triton(table, rows, cu_k, total)
    if backend not in ("auto", "torch"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    return kv_indices_ref(table, rows, cu_k, total)
