"""Decode-only attention that reads K/V in place from the pool (the CUDA-graph decode path).

Every request of the batch brings exactly one new token. The request rows and sequence lengths
come from two int64 tensors that the caller fills before the forward (``bind``), so the same
tensors serve every replay of a captured CUDA graph; ``prepare`` stages them itself when the
backend is used eagerly. No sliding window (the engine keeps such models off this path).
"""

from __future__ import annotations

import torch
from grammarserve_kernels.paged_decode import paged_decode_attention

from grammarserve.attention.backend import AttentionBackend
from grammarserve.attention.forward_batch import ForwardBatch
from grammarserve.attention.kv_pool import KVPool, ReqToTokenPool
from grammarserve.attention.staging import stage_int64


class PagedDecodeBackend(AttentionBackend):
    """One query per request, K/V read through the request-to-token table
    (:func:`grammarserve_kernels.paged_decode.paged_decode_attention`)."""

    def __init__(self, pool: KVPool, req_to_token: ReqToTokenPool) -> None:
        self.pool = pool
        self.req_to_token = req_to_token
        self._rows: torch.Tensor | None = None
        self._seq: torch.Tensor | None = None
        self._loc: torch.Tensor | None = None
        self.static = False

    def bind(self, rows: torch.Tensor, seq_lens: torch.Tensor) -> None:
        """Read rows and sequence lengths from these tensors from now on (``prepare`` then
        leaves them alone: the caller refills them in place before each forward)."""
        self._rows, self._seq, self.static = rows, seq_lens, True

    def prepare(self, batch: ForwardBatch) -> None:
        if any(n != 1 for n in batch.extend_lens):
            raise ValueError("PagedDecodeBackend runs decode batches only (one new token each)")
        self._loc = batch.out_cache_loc
        if not self.static:
            self._rows, self._seq = stage_int64([batch.req_pool_indices, batch.seq_lens],
                                                batch.input_ids.device)

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> torch.Tensor:
        if self._loc is None or self._rows is None or self._seq is None:
            raise RuntimeError("AttentionBackend.prepare(batch) must be called before forward()")
        self.pool.write(layer, self._loc, k, v)
        return paged_decode_attention(q.contiguous(), self.pool.k[layer], self.pool.v[layer],
                                      self.req_to_token.table, self._rows, self._seq,
                                      q.shape[-1] ** -0.5)
