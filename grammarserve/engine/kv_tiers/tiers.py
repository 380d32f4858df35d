"""The tiers under the radix cache, as the scheduler and the radix cache use them.

Contract
--------
- ``demote``: the radix cache calls it with an evicted leaf's whole path (tokens and slots from
  the root; the leaf's slots are still the pool's). Every complete block that ends inside the
  leaf is copied into the host tier (the head of the first one comes from the parent's slots,
  still in the tree). Tokens past the last complete block are lost.
- ``write_through``: the scheduler calls it when prompt KV enters the tree; the complete prompt
  blocks not yet on disk are copied (now, in the step: their slots may be reused at once) and
  queued for the disk writer.
- ``prefetch``: when a request is queued, its prompt's blocks past what the tree holds are read
  from disk into the host tier on the prefetch thread, while it waits for admission.
- ``restore``: at admission, blocks past the tree's match are taken from the host tier, else
  from disk, for as long as they are consecutive; their KV is written into freshly allocated
  pool slots and inserted into the tree, and the normal match then finds them. A block whose
  KV comes from another namespace, model, tokenizer, dtype or layout has another key: a miss.
- Every tier is optional and bounded; any failure is a miss, never wrong KV.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass

import torch

from grammarserve.attention.kv_pool import KVPool
from grammarserve.engine.kv_tiers.blocks import BlockLayout, chain_keys, gather, scatter
from grammarserve.engine.kv_tiers.disk import DiskTier
from grammarserve.engine.kv_tiers.host import HostTier
from grammarserve.fsm.pools import BackgroundPool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TierStats:
    """Counters of the tiers (tokens restored per tier, bytes held per tier)."""

    host_hit_tokens: int = 0
    disk_hit_tokens: int = 0
    prefetched_tokens: int = 0  # read from disk into the host tier ahead of admission
    demoted_tokens: int = 0
    promote_s: float = 0.0
    host_bytes: int = 0
    host_evictions: int = 0
    disk_bytes: int = 0
    disk_writes: int = 0
    disk_dropped: int = 0
    disk_corrupt: int = 0


class KVTiers:
    """A host tier and/or a disk tier of one pool's blocks (see the module docstring)."""

    def __init__(self, pool: KVPool, layout: BlockLayout, fingerprint: str, *,
                 host_bytes: int, disk_dir: str | None, disk_bytes: int) -> None:
        self.pool = pool
        self.layout = layout
        self.fingerprint = fingerprint
        self.host = HostTier(host_bytes) if host_bytes > 0 else None
        self.disk = DiskTier(disk_dir, disk_bytes, layout) if disk_dir and disk_bytes > 0 \
            else None
        self._prefetcher = BackgroundPool(1, "kv-prefetch") \
            if self.host is not None and self.disk is not None else None
        self._counts = {"host_hit_tokens": 0, "disk_hit_tokens": 0, "prefetched_tokens": 0,
                        "demoted_tokens": 0}
        self._pending: list[Future[None]] = []
        self._promote_s = 0.0
        self._lock = threading.Lock()  # the counters (the prefetch thread counts too)

    @property
    def block_tokens(self) -> int:
        return self.layout.block_tokens

    def keys(self, tokens: list[int], namespace: str, first: int = 0) -> list[str]:
        return chain_keys(tokens, namespace, self.fingerprint, self.block_tokens, first=first)

    def demote(self, tokens: list[int], slots: torch.Tensor, namespace: str, start: int) -> None:
        """Keep the complete blocks of ``tokens`` that end past ``start`` (see the contract)."""
        if self.host is None:
            return
        b = self.block_tokens
        first, count = start // b, len(tokens) // b
        if count <= first:
            return
        keys = self.keys(tokens[:count * b], namespace)[first:]
        todo = [i for i, key in enumerate(keys) if not self.host.touch(key)]
        if not todo:
            return
        idx = torch.cat([slots[(first + i) * b:(first + i + 1) * b] for i in todo])
        blocks = gather(self.pool, idx, self.layout)
        for block, i in zip(blocks, todo):
            self.host.put(keys[i], block)
        self._counts["demoted_tokens"] += len(todo) * b

    def write_through(self, tokens: list[int], slots: torch.Tensor, namespace: str,
                      start: int) -> None:
        """Queue the complete blocks of ``tokens`` that end past ``start`` for the disk tier."""
        if self.disk is None:
            return
        b = self.block_tokens
        first, count = start // b, len(tokens) // b
        if count <= first:
            return
        keys = self.keys(tokens[:count * b], namespace)[first:]
        todo = [i for i, key in enumerate(keys) if not self.disk.has(key)]
        if not todo:
            return
        idx = torch.cat([slots[(first + i) * b:(first + i + 1) * b] for i in todo])
        for block, i in zip(gather(self.pool, idx, self.layout), todo):
            self.disk.put(keys[i], block)

    def prefetch(self, tokens: list[int], namespace: str, cached: int) -> None:
        """Read the blocks of ``tokens`` past ``cached`` from disk into the host tier, on the
        prefetch thread (stops at the first block neither tier has)."""
        if self._prefetcher is None or len(tokens) // self.block_tokens <= cached // \
                self.block_tokens:
            return
        self._pending = [f for f in self._pending if not f.done()]
        queued = self._prefetcher.submit(self._prefetch, list(tokens), namespace, cached)
        if queued is not None:  # NOTE: None: closed (a prefetch is a hint)
            self._pending.append(queued)

    def wait_prefetched(self, timeout: float | None = None) -> bool:
        """Wait for the prefetches queued so far (tests, benchmarks); False on timeout."""
        _, pending = wait(self._pending, timeout)
        return not pending

    def _prefetch(self, tokens: list[int], namespace: str, cached: int) -> None:
        assert self.host is not None and self.disk is not None
        try:
            for key in self.keys(tokens, namespace)[cached // self.block_tokens:]:
                if self.host.touch(key):
                    continue
                block = self.disk.get(key)
                if block is None or not self.host.put(key, block):
                    return
                with self._lock:
                    self._counts["prefetched_tokens"] += self.block_tokens
        except Exception:  # NOTE: a prefetch is a hint; admission reads the disk itself
            log.exception("KV prefetch failed")

    def available(self, tokens: list[int], namespace: str, cached: int) -> int:
        """How many tokens past ``cached`` the tiers could restore (their blocks' presence,
        not read or verified: :meth:`restore` may find fewer)."""
        b, count = self.block_tokens, 0
        for key in self.keys(tokens, namespace)[cached // b:]:
            if not ((self.host is not None and key in self.host)
                    or (self.disk is not None and self.disk.has(key))):
                break
            count += 1
        return max(0, count * b - cached % b)

    def lookup(self, tokens: list[int], namespace: str,
               cached: int) -> list[tuple[torch.Tensor, str]]:
        """The consecutive blocks of ``tokens`` from the one holding position ``cached`` on,
        each from the host tier or else the disk tier, with the tier's counter name."""
        out: list[tuple[torch.Tensor, str]] = []
        for key in self.keys(tokens, namespace)[cached // self.block_tokens:]:
            block = self.host.get(key) if self.host is not None else None
            tier = "host_hit_tokens"
            if block is None and self.disk is not None:
                block, tier = self.disk.get(key), "disk_hit_tokens"
            if block is None:
                break
            out.append((block, tier))
        return out

    def restore(self, tokens: list[int], namespace: str, cached: int, cached_slots: torch.Tensor,
                make_room: Callable[[int], bool]) -> torch.Tensor | None:
        """The slots of ``tokens`` up to the last restored block (``cached_slots`` then the
        new ones, their KV written), or None if no tier holds the next block or the pool has
        no room. ``make_room(n)`` frees ``n`` slots (evicting; the caller locks its match)."""
        t0 = time.perf_counter()
        found = self.lookup(tokens, namespace, cached)
        spent = time.perf_counter() - t0
        if not found:
            return None
        b, offset = self.block_tokens, cached % self.block_tokens
        n = len(found) * b - offset
        if not make_room(n):  # NOTE: not timed: eviction (and demotion) of others
            return None
        t0 = time.perf_counter()
        slots = self.pool.alloc(n)
        scatter(self.pool, slots, [block for block, _ in found], offset)
        for i, (_, tier) in enumerate(found):
            with self._lock:
                self._counts[tier] += b - (offset if i == 0 else 0)
        self._promote_s += spent + time.perf_counter() - t0
        return torch.cat((cached_slots, slots))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for queued disk writes (tests, benchmarks, shutdown)."""
        return self.disk.flush(timeout) if self.disk is not None else True

    def close(self) -> None:
        """Drop the queued prefetches (hints), wait for the running one, then write what the
        disk tier has queued and stop its writer (``Engine.close``; the prefetcher closes at
        interpreter exit at the latest)."""
        if self._prefetcher is not None:
            self._prefetcher.close(wait=True)
        if self.disk is not None:
            self.disk.close()

    def stats(self) -> TierStats:
        d = self.disk.stats() if self.disk is not None else None
        with self._lock:
            counts = dict(self._counts)
        return TierStats(
            **counts, promote_s=self._promote_s,
            host_bytes=self.host.bytes if self.host is not None else 0,
            host_evictions=self.host.evictions if self.host is not None else 0,
            disk_bytes=d.bytes if d else 0, disk_writes=d.writes if d else 0,
            disk_dropped=d.dropped if d else 0, disk_corrupt=d.corrupt if d else 0)
