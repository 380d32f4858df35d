"""The disk tier: blocks as entries of a :class:`DiskStore` (authenticated with the
installation's secret, atomic, bounded, shared by the processes of one user, found again after
a restart). An entry is read only if it is a regular file no larger than one block's: a FIFO,
a link or a large file in the folder is a miss that never blocks admission.

Writes run on one background thread from a queue bounded in bytes: a block the queue has no
room for is not written (counted ``dropped``), so a slow disk never holds up a step. Reads
are synchronous (the caller decides which thread reads: the prefetch thread, or the engine at
admission). A payload of the wrong length is a corrupt entry and a miss; a key that names
another model, layout or namespace is simply another key (a miss).
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass

import torch

from grammarserve.disk_store import MAX_HEADER_BYTES, DiskStore
from grammarserve.engine.kv_tiers.blocks import BlockLayout, decode, encode

log = logging.getLogger(__name__)

NAMESPACE = "kv"
#: Bytes of blocks waiting to be written at most (beyond: not written).
MAX_QUEUED_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class DiskTierStats:
    hits: int
    misses: int
    writes: int
    dropped: int
    corrupt: int
    evictions: int
    bytes: int


class DiskTier:
    """Blocks of one layout in ``folder``, at most ``max_bytes``; ``secret_file``: the
    store's (default: ``cache_secret.default_secret_file()``)."""

    def __init__(self, folder: str, max_bytes: int, layout: BlockLayout, *,
                 secret_file: str | None = None) -> None:
        self.layout = layout
        self.store = DiskStore(folder, max_bytes, namespaces=(NAMESPACE,), label="KV disk tier",
                               max_entry_bytes=layout.nbytes + MAX_HEADER_BYTES,
                               secret_file=secret_file)
        self._queue: queue.Queue[tuple[str, torch.Tensor] | None] = queue.Queue()
        self._queued_bytes = 0
        self._queued: set[str] = set()  # keys waiting to be written
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self.dropped = 0
        self._writer = threading.Thread(target=self._write_loop, name="kv-disk-writer",
                                        daemon=True)
        self._writer.start()

    def has(self, key: str) -> bool:
        """Whether ``key``'s block is on disk or queued (not verified)."""
        with self._lock:
            if key in self._queued:
                return True
        return self.store.contains(NAMESPACE, key)

    def put(self, key: str, block: torch.Tensor) -> bool:
        """Queue ``block`` for writing; False if the queue has no room for it."""
        size = self.layout.nbytes
        with self._lock:
            if key in self._queued:
                return True
            if self._queued_bytes + size > MAX_QUEUED_BYTES:
                self.dropped += 1
                return False
            self._queued_bytes += size
            self._queued.add(key)
            self._idle.clear()
        self._queue.put((key, block))
        return True

    def get(self, key: str) -> torch.Tensor | None:
        """The block stored under ``key``, or None (a miss; a bad entry is removed)."""
        payload = self.store.get(NAMESPACE, key)
        if payload is None:
            return None
        block = decode(payload, self.layout)
        if block is None:
            self.store.discard(NAMESPACE, key)
        return block

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued block is written; False on timeout."""
        return self._idle.wait(timeout)

    def close(self) -> None:
        """Write what is queued, then stop the writer thread."""
        self._queue.put(None)
        self._writer.join()

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            key, block = item
            try:
                self.store.put(NAMESPACE, key, encode(block))
            except Exception:  # NOTE: a tier is optional; never take the writer down
                log.exception("KV disk tier: a block could not be written")
            with self._lock:
                self._queued.discard(key)
                self._queued_bytes -= self.layout.nbytes
                if self._queued_bytes == 0:
                    self._idle.set()

    def stats(self) -> DiskTierStats:
        s = self.store.stats()
        return DiskTierStats(hits=s.hits[NAMESPACE], misses=s.misses, writes=s.writes,
                             dropped=self.dropped, corrupt=s.corrupt, evictions=s.evictions,
                             bytes=s.bytes)
