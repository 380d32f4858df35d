"""The host-memory tier: blocks by key, least recently used out first, bounded in bytes.

Thread-safe: the engine thread demotes and promotes, the prefetch thread fills it from disk.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch


class HostTier:
    """Blocks (``[2, layers, block_tokens, heads, dim]`` host tensors) under ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._blocks: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.evictions = 0

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def get(self, key: str) -> torch.Tensor | None:
        """The block of ``key`` (now the most recently used), or None."""
        with self._lock:
            block = self._blocks.get(key)
            if block is not None:
                self._blocks.move_to_end(key)
            return block

    def touch(self, key: str) -> bool:
        """Mark ``key`` used; False if it is not here."""
        return self.get(key) is not None

    def put(self, key: str, block: torch.Tensor) -> bool:
        """Keep ``block`` (evicting the least recently used to fit); False if it cannot fit."""
        size = block.numel() * block.element_size()
        if size > self.max_bytes:
            return False
        with self._lock:
            old = self._blocks.pop(key, None)
            if old is not None:
                self.bytes -= old.numel() * old.element_size()
            while self._blocks and self.bytes + size > self.max_bytes:
                _, out = self._blocks.popitem(last=False)
                self.bytes -= out.numel() * out.element_size()
                self.evictions += 1
            self._blocks[key] = block
            self.bytes += size
        return True
