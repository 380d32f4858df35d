"""Q4_K, Q5_K and Q6_K quantization in numpy, and llama.cpp's Q4_K_M / Q5_K_M type mixes, for
random-weight GGUFs.

The ``gguf`` package dequantizes K-quants but does not quantize them. These quantizers are the
plain min/max kind (llama.cpp's ``llama-quantize`` searches each sub-block's scale and min; its
files are what benchmarks against llama-server use, ``benchmarks/peers.md``): a weight's error is
at most half a step, and the bytes follow the GGUF block layouts exactly, so ``gguf.quants``
dequantizes them (``tests/test_kquants.py``). Rows must be whole super-blocks of 256 values.
"""

from __future__ import annotations

import numpy as np

QK_K = 256


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def _blocks(arr: np.ndarray) -> np.ndarray:
    arr = np.asarray(arr, dtype=np.float32)
    if arr.ndim != 2 or arr.shape[1] % QK_K:
        raise ValueError(f"K-quant rows must be whole blocks of {QK_K}, got {arr.shape}")
    return arr.reshape(arr.shape[0], -1, QK_K)


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros(np.broadcast_shapes(a.shape, b.shape), np.float32),
                     where=b != 0)


def quantize_q4_k(arr: np.ndarray) -> np.ndarray:
    """``[N, K]`` fp32 -> Q4_K block bytes ``[N, K/256 * 144]``: per super-block fp16 ``d`` and
    ``dmin``, 8 sub-blocks of 32 with 6-bit scale and min, 4-bit values; ``w = d*sc*q - dmin*m``."""
    head, packed, q = _scaled_min_blocks(arr, 15)
    n = q.shape[0]
    return np.concatenate([head, packed, _nibbles(q)], -1).reshape(n, -1)


def quantize_q5_k(arr: np.ndarray) -> np.ndarray:
    """``[N, K]`` fp32 -> Q5_K block bytes ``[N, K/256 * 176]``: as Q4_K with 5-bit values, whose
    high bits follow the scales (bit s of ``qh[i]``: element i of sub-block s)."""
    head, packed, q = _scaled_min_blocks(arr, 31)
    n = q.shape[0]
    qh = np.bitwise_or.reduce((q >> 4) << np.arange(8, dtype=np.uint8)[:, None], axis=2)
    return np.concatenate([head, packed, qh, _nibbles(q & 15)], -1).reshape(n, -1)


def _scaled_min_blocks(arr: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K / Q5_K (``top``: 15 / 31) super-blocks: the fp16 ``d``, ``dmin`` bytes
    ``[N, nb, 4]``, the 12 bytes of packed 6-bit scales and mins, the values ``[N, nb, 8, 32]``."""
    x = _blocks(arr)
    n, nb = x.shape[:2]
    sub = x.reshape(n, nb, 8, 32)
    low = np.minimum(sub.min(-1), 0.0)                          # [n, nb, 8], <= 0
    scale = (sub.max(-1) - low) / float(top)
    d = _f16(scale.max(-1) / 63.0).astype(np.float32)           # [n, nb]
    dmin = _f16(-low.min(-1) / 63.0).astype(np.float32)
    sc = np.clip(np.rint(_safe_div(scale, d[..., None])), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(_safe_div(-low, dmin[..., None])), 0, 63).astype(np.uint8)
    step = (d[..., None] * sc)[..., None]                        # [n, nb, 8, 1]
    offset = (dmin[..., None] * mn)[..., None]
    q = np.clip(np.rint(_safe_div(sub + offset, step)), 0, top).astype(np.uint8)
    packed = np.zeros((n, nb, 12), np.uint8)
    packed[..., 0:4] = sc[..., :4] | ((sc[..., 4:] >> 4) << 6)
    packed[..., 4:8] = mn[..., :4] | ((mn[..., 4:] >> 4) << 6)
    packed[..., 8:12] = (sc[..., 4:] & 15) | ((mn[..., 4:] & 15) << 4)
    head = np.stack([_f16(d), _f16(dmin)], -1).view(np.uint8).reshape(n, nb, 4)
    return head, packed, q


def _nibbles(q: np.ndarray) -> np.ndarray:
    """4-bit values ``[N, nb, 8, 32]`` -> the 128 bytes of a super-block: sub-blocks 2j (low
    nibbles) and 2j+1 (high) share 32 bytes."""
    n, nb = q.shape[:2]
    pairs = q.reshape(n, nb, 4, 2, 32)
    return (pairs[..., 0, :] | (pairs[..., 1, :] << 4)).reshape(n, nb, 128)


def quantize_q6_k(arr: np.ndarray) -> np.ndarray:
    """``[N, K]`` fp32 -> Q6_K block bytes ``[N, K/256 * 210]``: 16 groups of 16 with int8
    scales, 6-bit values around 32, one fp16 ``d`` per super-block; ``w = d*sc*(q - 32)``."""
    x = _blocks(arr)
    n, nb = x.shape[:2]
    groups = x.reshape(n, nb, 16, 16)
    scale = np.abs(groups).max(-1) / 31.0                         # [n, nb, 16]
    d = _f16(scale.max(-1) / 127.0).astype(np.float32)
    sc = np.clip(np.rint(_safe_div(scale, d[..., None])), -128, 127).astype(np.int8)
    step = (d[..., None] * sc.astype(np.float32))[..., None]
    q = (np.clip(np.rint(_safe_div(groups, step)), -32, 31) + 32).astype(np.uint8)
    q = q.reshape(n, nb, 2, 4, 32)                                # [half, quarter, 32]
    ql = np.concatenate([(q[..., 0, :] & 15) | ((q[..., 2, :] & 15) << 4),
                         (q[..., 1, :] & 15) | ((q[..., 3, :] & 15) << 4)], -1)  # [n, nb, 2, 64]
    qh = sum(((q[..., j, :] >> 4) << (2 * j)) for j in range(4)).astype(np.uint8)  # [n, nb, 2, 32]
    tail = np.concatenate([sc.view(np.uint8), _f16(d)[..., None].view(np.uint8)], -1)
    return np.concatenate([ql.reshape(n, nb, 128), qh.reshape(n, nb, 64), tail],
                          -1).reshape(n, -1)


def q4_k_m_type(name: str, layers: int, tied: bool) -> str:
    """The type llama.cpp's Q4_K_M gives tensor ``name`` (``blk.{i}.attn_v.weight``, ...) of a
    model with ``layers`` blocks: Q6_K for the output (the token embedding where ``tied``) and,
    in the layers ``use_more_bits`` picks, for attn_v and ffn_down; Q4_K otherwise
    (``src/llama-quant.cpp``)."""
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return "Q6_K"
    if name.startswith("blk.") and name.endswith((".attn_v.weight", ".ffn_down.weight")):
        i = int(name.split(".")[1])
        if i < layers // 8 or i >= 7 * layers // 8 or (i - layers // 8) % 3 == 2:
            return "Q6_K"
    return "Q4_K"


def q5_k_m_type(name: str, layers: int, tied: bool) -> str:
    """The type llama.cpp's Q5_K_M gives tensor ``name``: Q4_K_M's mix with Q5_K in place of
    Q4_K (``src/llama-quant.cpp``)."""
    kind = q4_k_m_type(name, layers, tied)
    return "Q5_K" if kind == "Q4_K" else kind


QUANTIZERS = {"Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k}
