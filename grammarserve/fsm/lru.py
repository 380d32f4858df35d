"""An LRU map bounded in entries and in bytes, for memos keyed by request inputs (which a client
can make as large as the body limit allows, so a bound on entries alone does not bound
memory)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

V = TypeVar("V")


class BoundedLRU(Generic[V]):
    """``key -> value`` with least-recently-used eviction once more than ``max_entries``
    entries or ``max_bytes`` bytes (each entry weighs ``len(key) + cost`` as given to
    :meth:`put`) are held. Thread-safe."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._data: OrderedDict[str, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> V | None:
        """The value of ``key`` (now the most recently used), or None."""
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                return None
            self._data.move_to_end(key)
            return entry[0]

    def put(self, key: str, value: V, cost: int = 0) -> None:
        """Keep ``value`` under ``key``; an entry heavier than the whole bound is not kept."""
        weight = len(key) + cost
        with self._lock:
            self._drop(key)
            if weight > self.max_bytes or self.max_entries <= 0:
                return
            self._data[key] = (value, weight)
            self._bytes += weight
            while len(self._data) > self.max_entries or self._bytes > self.max_bytes:
                _, (_, old) = self._data.popitem(last=False)
                self._bytes -= old

    def pop(self, key: str) -> None:
        """Forget ``key`` (no-op if absent)."""
        with self._lock:
            self._drop(key)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._data)

    @property
    def nbytes(self) -> int:
        """Bytes held (keys plus the costs given)."""
        return self._bytes

    def _drop(self, key: str) -> None:
        entry = self._data.pop(key, None)
        if entry is not None:
            self._bytes -= entry[1]
