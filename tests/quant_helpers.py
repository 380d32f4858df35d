"""Random GGUF Q4_1 / Q8_0 weight blocks for the quantized-kernel tests."""

from __future__ import annotations

import numpy as np


def random_blocks(kind: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Random GGUF block bytes ``[n, k/32 * size]`` with finite fp16 scales."""
    rng = np.random.default_rng(seed)
    nb = k // 32
    if kind == "Q4_1":
        head = np.stack([rng.uniform(0.001, 0.05, (n, nb)), rng.uniform(-0.4, 0.0, (n, nb))], -1)
        quants = rng.integers(0, 256, (n, nb, 16), dtype=np.uint8)
    else:
        head = rng.uniform(0.001, 0.05, (n, nb, 1))
        quants = rng.integers(-128, 128, (n, nb, 32), dtype=np.int8).view(np.uint8)
    scales = head.astype(np.float16).view(np.uint8).reshape(n, nb, -1)
    return np.concatenate([scales, quants], axis=2).reshape(n, -1)
