"""Test helpers: pack a boolean allowed-token matrix into the int32 bitmask layout, and back."""

from __future__ import annotations

import torch


def pack_bitmask(allowed: torch.Tensor) -> torch.Tensor:
    """bool ``[B, V]`` -> int32 ``[B, ceil(V/32)]`` (bit set = allowed)."""
    b, v = allowed.shape
    words = (v + 31) // 32
    bits = torch.zeros(b, words * 32, dtype=torch.int64)
    bits[:, :v] = allowed.long()
    packed = (bits.view(b, words, 32) << torch.arange(32)).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """int32 ``[B, ceil(V/32)]`` (bit set = allowed) -> bool ``[B, V]``."""
    bits = (bitmask.to(torch.int64)[:, :, None] >> torch.arange(32)) & 1
    return bits.flatten(1)[:, :vocab].bool()
