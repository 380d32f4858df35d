"""Dispatch for the fused mask + sample kernel: Triton on CUDA tensors, torch elsewhere."""

from __future__ import annotations

from typing import Literal

import torch
from grammarserve_kernels.sample_ref import check_inputs, sample_tokens_ref

Backend = Literal["auto", "torch", "triton"]


def _triton_usable(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def sample_tokens(logits: torch.Tensor, bitmask: torch.Tensor | None, temperature: torch.Tensor,
                  keys: torch.Tensor, *,
                  backend: Backend = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Mask, scale by temperature and sample one token per row, with its log-probability.

    Parameters
    ----------
    logits:
        ``[B, V]`` fp32, bf16 or fp16.
    bitmask:
        int32 ``[B, ceil(V/32)]`` on the logits' device, bit set = allowed (all ones for an
        unconstrained row), or None when no row is constrained.
    temperature:
        fp32 ``[B]``; 0 = greedy (argmax of the masked logits, first index on ties).
    keys:
        int64 ``[B, 2]`` from :func:`grammarserve_kernels.stream_keys`; the same key gives the
        same token for the same logits. Ignored for greedy rows.
    backend:
        ``"auto"`` uses Triton on CUDA tensors (when installed) and torch otherwise; ``"triton"``
        forces the kernel (on CPU tensors it needs ``TRITON_INTERPRET=1``).

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        int64 token ids ``[B]`` and fp32 log-probabilities ``[B]`` of the chosen tokens under the
        masked, temperature-scaled distribution (greedy rows: under the masked softmax). A row
        whose mask allows no token gets id ``-1`` and log-probability ``-inf``.
    """
    check_inputs(logits, bitmask, temperature, keys)
    if backend == "triton" or (backend == "auto" and _triton_usable(logits.device)):
        from grammarserve_kernels.sample_triton import sample_tokens_triton

        return sample_tokens_triton(logits, bitmask, temperature, keys)
    if backend not in ("auto", "torch"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    return sample_tokens_ref(logits, bitmask, temperature, keys)
