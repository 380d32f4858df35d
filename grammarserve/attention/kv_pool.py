"""Token-slot KV pool and the request-to-token table.

The pool stores K and V per layer as ``[num_slots, kv_heads, head_dim]``. A slot holds one token's
K/V for every layer. Slot 0 is reserved as padding: it is never handed out, so index tensors can be
padded with 0 safely.
"""

from __future__ import annotations

import torch

from grammarserve.errors import OutOfMemoryError


class KVPool:
    """K/V storage for ``capacity`` tokens plus the padding slot, and its slot allocator."""

    def __init__(
        self,
        *,
        capacity: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        if capacity < 1:
            raise ValueError(f"KV pool capacity must be >= 1 token, got {capacity}")
        self.capacity = capacity
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (capacity + 1, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self._free = torch.arange(1, capacity + 1, dtype=torch.int64, device=self.device)
        # Per slot, the serial number of the alloc() that last handed it out (0: never): a
        # slot's K/V is written once after its alloc and read-only until it is freed, so a copy
        # made while the slot had stamp t is still the slot's K/V while its stamp is t
        # (``RowMirror`` reuses a finished row's copy of a prefix that way).
        self.stamp = torch.zeros(capacity + 1, dtype=torch.int64, device=self.device)
        self._serial = 0

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        """Bytes one token's K and V take over all layers."""
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * num_kv_heads * head_dim * elem

    @property
    def num_free(self) -> int:
        return int(self._free.numel())

    def alloc(self, n: int) -> torch.Tensor:
        """Take ``n`` free slots; raises :class:`OutOfMemoryError` if fewer are free."""
        if n > self.num_free:
            raise OutOfMemoryError(f"KV pool has {self.num_free} free slots, {n} requested")
        out, self._free = self._free[:n], self._free[n:]
        if n:
            self._serial += 1
            self.stamp[out] = self._serial
        return out

    def free(self, slots: torch.Tensor) -> None:
        """Return slots to the pool. Slot 0 (padding) must never be passed."""
        if slots.numel():
            self._free = torch.cat((self._free, slots.to(torch.int64)))

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the K/V of new tokens ``[T, kv_heads, head_dim]`` at ``slots`` ``[T]``."""
        self.k[layer].index_copy_(0, slots, k.to(self.dtype))
        self.v[layer].index_copy_(0, slots, v.to(self.dtype))


class ReqToTokenPool:
    """``[max_reqs, max_context]`` table: row r lists the KV slots of request r's tokens in order."""

    def __init__(self, *, max_reqs: int, max_context: int,
                 device: torch.device | str = "cpu") -> None:
        self.max_context = max_context
        self.table = torch.zeros((max_reqs, max_context), dtype=torch.int64, device=device)
        self._free_rows = list(range(max_reqs - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int:
        if not self._free_rows:
            raise OutOfMemoryError("no free request slot (max_num_reqs reached)")
        return self._free_rows.pop()

    def free(self, row: int) -> None:
        self.table[row].zero_()
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Record ``slots`` as the KV slots of tokens ``start .. start+len(slots)`` of ``row``."""
        end = start + slots.numel()
        if end > self.max_context:
            raise OutOfMemoryError(
                f"sequence of {end} tokens exceeds the context limit {self.max_context}"
            )
        self.table[row, start:end] = slots

    def slots(self, row: int, length: int) -> torch.Tensor:
        return self.table[row, :length]
