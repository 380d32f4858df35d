"""Compute kernels (installed as ``grammarserve_kernels``): each Triton kernel sits beside the torch
reference implementation that is also its CPU path."""

from grammarserve_kernels.controls import SamplingControls, build_controls
from grammarserve_kernels.filters import filter_logits
from grammarserve_kernels.noise import stream_keys
from grammarserve_kernels.sample import greedy_tokens, sample_tokens
from grammarserve_kernels.sample_ref import MAX_TOP, SAMPLE_BLOCK, Sampled, masked_scaled_logits

__all__ = ["MAX_TOP", "SAMPLE_BLOCK", "Sampled", "SamplingControls", "build_controls",
           "filter_logits", "greedy_tokens", "masked_scaled_logits", "sample_tokens",
           "stream_keys"]
