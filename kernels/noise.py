"""Counter-based random noise shared by the torch and Triton sampling paths.

A row's stream is a 64-bit key derived on the host from ``(seed, offset)``; the noise for counter
``c`` of that stream is a 32-bit integer hash of ``(key, c)``. Both paths compute the hash with
the same integer operations, so they draw the same noise for the same key and counter, on any
device and for any batch composition. The torch path draws its few noise values with numpy on
the host (V / block + block per row): many tiny torch ops cost more than the hashing itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF
# triple32 (Chris Wellons' hash-prospector): a 32-bit bijection with very low bias.
MIX_SHIFTS = (17, 11, 15, 14)
MIX_MULTS = (0xED5AD4BB, 0xAC4C1B51, 0x31848BAB)
# u = (2 * (h >> 9) + 1) * 2^-24: an odd 24-bit grid in (0, 1), exact in fp32 on every path.
UNIFORM_SCALE = 2.0**-24


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def stream_key(seed: int, offset: int) -> tuple[int, int]:
    """The ``(lo, hi)`` 32-bit halves of the key of draw ``offset`` of stream ``seed``."""
    z = _splitmix64((seed & _M64) ^ _splitmix64(offset & _M64))
    return z & _M32, z >> 32


def stream_keys(seeds: Sequence[int], offsets: Sequence[int],
                device: torch.device | str = "cpu") -> torch.Tensor:
    """Keys for a batch of draws.

    Parameters
    ----------
    seeds, offsets:
        One ``(seed, offset)`` pair per row.
    device:
        Where the returned tensor lives.

    Returns
    -------
    torch.Tensor
        int64 ``[B, 2]``: each row's key as two values in ``[0, 2**32)``.
    """
    keys = [stream_key(s, o) for s, o in zip(seeds, offsets)]
    return torch.tensor(keys, dtype=torch.int64, device=device).reshape(len(keys), 2)


def gumbel(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """Standard Gumbel noise for each row's counters (numpy: uint32 arithmetic wraps natively).

    Parameters
    ----------
    keys:
        ``[B, 2]`` integer array of 32-bit key halves (:func:`stream_keys`).
    counters:
        ``[B, N]`` integer array, values in ``[0, 2**32)``.

    Returns
    -------
    np.ndarray
        float32 ``[B, N]``: ``-log(-log(u))`` with ``u`` uniform on an odd 24-bit grid in (0, 1).
    """
    lo = keys[:, 0:1].astype(np.uint32)
    hi = keys[:, 1:2].astype(np.uint32)
    h = mix32(mix32(counters.astype(np.uint32) ^ lo) ^ hi)
    u = ((h >> np.uint32(9)) * np.uint32(2) + np.uint32(1)).astype(np.float32)
    u *= np.float32(UNIFORM_SCALE)
    return -np.log(-np.log(u))


def mix32(x: np.ndarray) -> np.ndarray:
    """triple32 on a uint32 array (in place)."""
    for shift, mult in zip(MIX_SHIFTS, MIX_MULTS):
        x ^= x >> np.uint32(shift)
        x *= np.uint32(mult)
    x ^= x >> np.uint32(MIX_SHIFTS[-1])
    return x
