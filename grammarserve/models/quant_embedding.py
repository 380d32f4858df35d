"""Token embeddings looked up straight from GGUF blocks (one copy: no fp32 table)."""

from __future__ import annotations

import torch
from grammarserve_kernels.quant import QuantWeight, dequantize
from torch import nn


class QuantEmbedding(nn.Module):
    """``nn.Embedding``'s lookup over a :class:`QuantWeight` of ``[vocab, hidden]`` rows: each
    call dequantizes only the rows it gathers, to the exact fp32 values the dense table would
    hold (``dequantize`` is exact), so replies do not change."""

    def __init__(self, rows: QuantWeight) -> None:
        super().__init__()
        self.rows = rows
        self.num_embeddings, self.embedding_dim = rows.shape

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        w = self.rows
        m = w.m[flat] if w.m.numel() else w.m
        picked = QuantWeight(w.kind, w.qs[flat], w.d[flat], m)
        return dequantize(picked).view(*ids.shape, self.embedding_dim)
