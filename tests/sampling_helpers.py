"""Test helper: one row's log-probabilities after temperature, top-k, top-p and min-p, through the
kernels' own filter (what the sampler draws from), to check a sampled token's reported logprob."""

from __future__ import annotations

import torch
from grammarserve_kernels import filter_logits, masked_scaled_logits

from grammarserve.sampling_params import SamplingParams


def filtered_logprobs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Apply temperature, top-k, top-p and min-p to one row ``[V]``; returns log-probs."""
    device = logits.device
    y = masked_scaled_logits(logits[None], None,
                             torch.tensor([p.temperature], dtype=torch.float32, device=device))
    top_k = torch.tensor([p.top_k], dtype=torch.int64, device=device)
    top_p = torch.tensor([p.top_p], dtype=torch.float32, device=device)
    min_p = torch.tensor([p.min_p], dtype=torch.float32, device=device)
    return torch.log_softmax(filter_logits(y, top_k, top_p, min_p)[0], dim=-1)
