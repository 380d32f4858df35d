"""Dispatch for the fused mask + sample kernel: Triton on CUDA tensors, torch elsewhere."""

from __future__ import annotations

from typing import Literal

import torch
from grammarserve_kernels.controls import SamplingControls
from grammarserve_kernels.greedy import greedy_kernel, greedy_tokens_cpu
from grammarserve_kernels.sample_ref import (
    Sampled,
    all_greedy,
    check_inputs,
    greedy_tokens_ref,
    sample_tokens_ref,
)

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
                  keys: torch.Tensor, *, controls: SamplingControls | None = None,
                  num_top: torch.Tensor | None = None, backend: Backend = "auto") -> Sampled:
    """Apply penalties and logit bias, mask, scale by temperature and sample one token per row,
    with its log-probability and, on request, the row's top log-probabilities.

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
    controls:
        Frequency / presence / repetition penalties and logit bias of the rows that have them
        (:class:`grammarserve_kernels.controls.SamplingControls`), applied to the raw logits
        before the mask: a bias never re-allows a masked token. None = no row has any.
    num_top:
        int64 ``[B]``: how many top log-probabilities each row wants (0..20; 0 = none), or None.
    backend:
        ``"auto"`` uses Triton on CUDA tensors (when installed) and torch otherwise; ``"triton"``
        forces the kernel (on CPU tensors it needs ``TRITON_INTERPRET=1``).

    Returns
    -------
    Sampled
        int64 token ids ``[B]`` and fp32 log-probabilities ``[B]`` of the chosen tokens under the
        processed (penalized, biased, masked, temperature-scaled) distribution (greedy rows:
        temperature 1). A row whose mask allows no token gets id ``-1`` and log-probability
        ``-inf``. Then ``top_ids`` / ``top_logprobs`` ``[B, max(num_top)]`` under the same
        distribution, best first; only tokens the mask allows are listed (the rest of a row is
        ``-1`` / ``-inf``).
    """
    check_inputs(logits, bitmask, temperature, keys, controls, num_top)
    if backend == "triton" or (backend == "auto" and _triton_usable(logits.device)):
        from grammarserve_kernels.sample_triton import sample_tokens_triton

        return sample_tokens_triton(logits, bitmask, temperature, keys, controls=controls,
                                    num_top=num_top)
    if backend not in ("auto", "torch"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    if backend == "auto" and logits.device.type == "cpu" and all_greedy(temperature, controls,
                                                                       num_top):
        return greedy_tokens(logits, bitmask)
    return sample_tokens_ref(logits, bitmask, temperature, keys, controls=controls,
                             num_top=num_top)


def greedy_tokens(logits: torch.Tensor, bitmask: torch.Tensor | None) -> Sampled:
    """Every row greedy, no controls, no top log-probabilities: each row's argmax under
    ``bitmask`` (first index on ties) and its log-probability, as :func:`sample_tokens` gives
    them; on CPU fp32 logits by the C++ kernel (``greedy.py``), else by the torch reference."""
    b = logits.shape[0] if logits.dim() == 2 else 0
    check_inputs(logits, bitmask, torch.zeros(b, device=logits.device),
                 torch.zeros(b, 2, dtype=torch.int64, device=logits.device))
    lib = greedy_kernel() if (logits.device.type == "cpu" and logits.dtype == torch.float32
                              and logits.stride(1) == 1) else None
    if lib is None:
        return greedy_tokens_ref(logits, bitmask)
    ids, logprobs = greedy_tokens_cpu(logits, bitmask, lib)
    none = torch.empty(ids.shape[0], 0)
    return Sampled(ids, logprobs, none.long(), none)
