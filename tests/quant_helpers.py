"""Random GGUF Q4_1 / Q8_0 / Q4_0 / Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K weight blocks for the
quantized-kernel tests."""

from __future__ import annotations

import numpy as np


def random_blocks(kind: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Random GGUF block bytes ``[n, k/32 * size]`` with finite fp16 scales."""
    rng = np.random.default_rng(seed)
    if kind == "Q4_K":
        return _random_q4_k(rng, n, k // 256)
    if kind == "Q6_K":
        return _random_q6_k(rng, n, k // 256)
    if kind == "Q5_K":
        return _random_q5_k(rng, n, k // 256)
    if kind in _SMALL:
        return _random_small(kind, rng, n, k // 32)
    nb = k // 32
    if kind == "Q4_1":
        head = np.stack([rng.uniform(0.001, 0.05, (n, nb)), rng.uniform(-0.4, 0.0, (n, nb))], -1)
        quants = rng.integers(0, 256, (n, nb, 16), dtype=np.uint8)
    else:
        head = rng.uniform(0.001, 0.05, (n, nb, 1))
        quants = rng.integers(-128, 128, (n, nb, 32), dtype=np.int8).view(np.uint8)
    scales = head.astype(np.float16).view(np.uint8).reshape(n, nb, -1)
    return np.concatenate([scales, quants], axis=2).reshape(n, -1)


def _random_q4_k(rng: np.random.Generator, n: int, nb: int) -> np.ndarray:
    """Q4_K super-blocks (144 bytes: fp16 d and dmin, 12 bytes of 6-bit scales and mins, 128
    of nibbles): random bytes, with the edge values in the first row (d = 0; every scale and
    min at 63, the largest 6-bit value)."""
    heads = np.stack([rng.uniform(1e-4, 2e-3, (n, nb)), rng.uniform(1e-4, 2e-3, (n, nb))], -1)
    heads[0, 0, 0] = 0.0
    packed = rng.integers(0, 256, (n, nb, 12), dtype=np.uint8)
    packed[0, -1] = 0xFF  # 63 everywhere
    quants = rng.integers(0, 256, (n, nb, 128), dtype=np.uint8)
    d = heads.astype(np.float16).view(np.uint8).reshape(n, nb, 4)
    return np.concatenate([d, packed, quants], axis=2).reshape(n, -1)


def _random_q6_k(rng: np.random.Generator, n: int, nb: int) -> np.ndarray:
    """Q6_K super-blocks (210 bytes: 128 of low nibbles, 64 of high 2-bit pairs, 16 int8 scales,
    fp16 d): random bytes, with the edge values in the first row (d = 0 in its first block; the
    scales -128 and 127; the 6-bit values all 0 in one block and all 63 in another)."""
    low = rng.integers(0, 256, (n, nb, 128), dtype=np.uint8)
    high = rng.integers(0, 256, (n, nb, 64), dtype=np.uint8)
    scales = rng.integers(-128, 128, (n, nb, 16), dtype=np.int8)
    d = rng.uniform(1e-6, 1e-3, (n, nb, 1))  # |w| up to 4, as Q8_0's 6 (fp16 subnormals too)
    d[0, 0] = 0.0
    scales[0, -1, ::2], scales[0, -1, 1::2] = -128, 127
    if nb > 1:
        low[0, 1], high[0, 1] = 0, 0  # q = 0 everywhere
    low[0, -1], high[0, -1] = 0xFF, 0xFF  # q = 63 everywhere
    head = np.concatenate([scales.view(np.uint8), d.astype(np.float16).view(np.uint8)], axis=2)
    return np.concatenate([low, high, head], axis=2).reshape(n, -1)


_SMALL = {"Q4_0": 16, "Q5_0": 20, "Q5_1": 20}  # bytes after the fp16 head(s)


def _random_small(kind: str, rng: np.random.Generator, n: int, nb: int) -> np.ndarray:
    """Q4_0 (fp16 d, 16 bytes of nibbles), Q5_0 (d, 4 bytes of high bits, 16 of nibbles) and
    Q5_1 (d, m, then as Q5_0) blocks: random bytes, ``d`` of either sign, with the edge values
    in the first row (d = 0; every q 0; every q at its largest) where it has three blocks."""
    heads = rng.uniform(-0.05, 0.05, (n, nb, 2 if kind == "Q5_1" else 1))
    body = rng.integers(0, 256, (n, nb, _SMALL[kind]), dtype=np.uint8)
    if nb >= 3:
        heads[0, 0, 0] = 0.0
        body[0, 1], body[0, 2] = 0, 0xFF
    head = heads.astype(np.float16).view(np.uint8).reshape(n, nb, -1)
    return np.concatenate([head, body], axis=2).reshape(n, -1)


def _random_q5_k(rng: np.random.Generator, n: int, nb: int) -> np.ndarray:
    """Q5_K super-blocks (176 bytes: fp16 d and dmin, 12 bytes of 6-bit scales and mins, 32 of
    high bits, 128 of nibbles): random bytes, with the edge values in the first row (d = 0;
    every scale and min 63; every q 0 in one block and 31 in another)."""
    raw = _random_q4_k(rng, n, nb).reshape(n, nb, 144)
    high = rng.integers(0, 256, (n, nb, 32), dtype=np.uint8)
    high[0, -1] = 0xFF
    if nb > 1:
        raw[0, 1, 16:], high[0, 1] = 0, 0
    raw[0, -1, 16:] = 0xFF
    return np.concatenate([raw[..., :16], high, raw[..., 16:]], axis=2).reshape(n, -1)
