"""Greedy rows on CPU (``greedy_cpu.cpp``): the argmax of the masked logits and its
log-probability, in two vectorized passes; :func:`~grammarserve_kernels.sample_ref.greedy_tokens_ref`
is the torch reference and the fallback where the kernel cannot be built."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from grammarserve_kernels.cpu_build import open_cached
from grammarserve_kernels.quant_q8 import _COMMON, cpu_isa

_SOURCE = Path(__file__).with_name("greedy_cpu.cpp")


def greedy_kernel() -> ctypes.CDLL | None:
    """The built kernel, or None where this CPU has no AVX2+FMA or the build failed."""
    if cpu_isa() is None:
        return None
    return open_cached(_SOURCE, _COMMON, "avx2", declare=_declare)


def _declare(lib: ctypes.CDLL) -> None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.gs_greedy.argtypes = [ptr, i64, i64, i64, ptr, i64, ptr, ptr, ctypes.c_int]
    lib.gs_greedy.restype = None


def greedy_tokens_cpu(logits: torch.Tensor, bitmask: torch.Tensor | None,
                      lib: ctypes.CDLL) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 ids ``[B]`` (-1 where nothing is allowed) and fp32 log-probabilities ``[B]`` of the
    greedy tokens of fp32 CPU ``logits [B, V]`` (rows contiguous) under ``bitmask``."""
    b, v = logits.shape
    if logits.dtype != torch.float32 or logits.device.type != "cpu" or logits.stride(1) != 1:
        raise ValueError("logits must be fp32 on CPU with contiguous rows")
    ids = torch.empty(b, dtype=torch.int64)
    logprobs = torch.empty(b, dtype=torch.float32)
    mask = None if bitmask is None else bitmask.contiguous()
    lib.gs_greedy(logits.data_ptr(), b, v, logits.stride(0),
                  None if mask is None else mask.data_ptr(),
                  0 if mask is None else mask.shape[1], ids.data_ptr(), logprobs.data_ptr(),
                  torch.get_num_threads())
    return ids, logprobs
