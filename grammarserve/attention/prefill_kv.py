"""Contiguous K/V of a request attended alone with a long prefix: a prompt prefilled in chunks.

A long prompt is prefilled a chunk a step (``engine/step_pacer.py``); each chunk attends to the
whole prompt so far. Its slots in the token-slot pool are not contiguous (chunks interleave with
the decode rows' allocations), so gathering the prefix's K/V from the pool cost a copy of every
earlier position, every layer, every step: at 8,000 tokens on the embedded model ~370 MB a step,
for a chunk of a few tokens. :class:`PrefillKV` keeps such a request's K/V contiguous across
steps, per layer ``[kv_heads, capacity, head_dim]`` in the pool's dtype: its prefix is gathered
once, then each step's new tokens are appended (:meth:`PrefillKV.append`, the same values the
pool holds) and attention reads a view of it.

Contracts:

* The pool stays the source of truth. A held position is used only while its slot is still the
  request's (the request-to-token table) and has not been reallocated since the copy (the
  pool's allocation stamps, ``KVPool.stamp``); otherwise it is gathered again.
* Entries are bounded by ``max_tokens`` positions of capacity in all; :meth:`plan` returns False
  where an entry does not fit (after evicting entries no request of this step uses) and the
  caller falls back to the gather.
* An entry is dropped when its request is seen in a step outside this path (its prefill ended:
  it decodes in the decode mirror), after :data:`KEEP_STEPS` steps without it (it left or
  waits), or on :meth:`release`.

:func:`mirror_split` picks which members of the short (decode) group to attend alone this way:
a long prompt's chunks (in the mirror they forced every row's capacity to the prompt's length
as it grew, each growth a copy of the whole mirror) and members that would push the decode
mirror past its budget, so the decode rows keep the fused mirrored path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from grammarserve.attention.kv_pool import KVPool

HEADROOM = 256  # positions added past the need when an entry grows (geometric, at least this)
KEEP_STEPS = 4  # an entry no step used for this many steps is dropped
MIN_SHARED = 64  # as cascade.MIN_SHARED: shorter common prefixes are not split off the mirror
TILE = 16  # the decode mirror's capacity granule (row_mirror: KEY_TILE)
CHUNK_EXTEND = 16  # a short group's member with more new tokens is a prompt's chunk (or a span)
MIN_APART = 512  # a chunk is attended apart from the decode rows from this many positions on
LONG_FACTOR = 2  # ... and when it is this many times longer than the decode rows' longest


@dataclass
class _Entry:
    """One request's contiguous K/V: positions ``0 .. length`` valid."""

    k: list[torch.Tensor]  # per layer [kv_heads, capacity, head_dim]
    v: list[torch.Tensor]
    slots: torch.Tensor  # [capacity] pool slot of each held position (valid up to length)
    stamps: torch.Tensor  # [capacity] its allocation stamp at copy time
    length: int = 0
    used: int = 0  # last step that planned it
    start: int = 0  # this step's new tokens: positions start .. start + extend
    extend: int = 0

    @property
    def capacity(self) -> int:
        return int(self.slots.numel())


@dataclass
class PrefillKV:
    """Per-request contiguous K/V (see the module docstring)."""

    pool: KVPool
    table: torch.Tensor  # the request-to-token table
    max_tokens: int  # capacity of all entries together, in positions
    max_context: int
    entries: dict[int, _Entry] = field(default_factory=dict)  # seq_id -> entry
    step: int = 0
    gathered_positions: int = 0  # positions copied from the pool (not appended)

    @property
    def tokens(self) -> int:
        """Capacity held by all entries, in positions."""
        return sum(e.capacity for e in self.entries.values())

    def begin(self, elsewhere: list[int]) -> None:
        """Start a step: ``elsewhere``, the seq ids of this step attended on other paths (their
        entries are dropped), and entries unused for :data:`KEEP_STEPS` steps are dropped."""
        self.step += 1
        for sid in elsewhere:
            self.entries.pop(sid, None)
        for sid in [s for s, e in self.entries.items() if self.step - e.used > KEEP_STEPS]:
            del self.entries[sid]

    def release(self, seq_id: int) -> None:
        """Drop ``seq_id``'s entry, if any."""
        self.entries.pop(seq_id, None)

    def plan(self, seq_id: int, table_row: int, prefix: int, extend: int) -> bool:
        """Hold positions ``0 .. prefix`` of the request (gathered from the pool where missing or
        stale) with room for ``extend`` new ones this step; False where it does not fit."""
        if seq_id < 0:
            return False
        need = prefix + extend
        e = self.entries.get(seq_id)
        if e is not None:
            e.length = self._valid(e, table_row, min(e.length, prefix))
        if e is None or e.capacity < need:
            e = self._grow(seq_id, e, need)
            if e is None:
                return False
        if e.length < prefix:
            self._gather(e, table_row, e.length, prefix)
        new = self.table[table_row, prefix:need]  # the forward batch wrote them already
        e.slots[prefix:need] = new
        e.stamps[prefix:need] = self.pool.stamp[new]
        e.length, e.used, e.start, e.extend = need, self.step, prefix, extend
        return True

    def append(self, layer: int, seq_id: int,
               slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy this step's new tokens of ``layer`` (already in the pool at ``slots``) into the
        entry; returns its K and V ``[kv_heads, length, head_dim]`` (views)."""
        e = self.entries[seq_id]
        end = e.start + e.extend
        e.k[layer][:, e.start:end] = self.pool.k[layer].index_select(0, slots).transpose(0, 1)
        e.v[layer][:, e.start:end] = self.pool.v[layer].index_select(0, slots).transpose(0, 1)
        return e.k[layer][:, :end], e.v[layer][:, :end]

    def _valid(self, e: _Entry, table_row: int, n: int) -> int:
        """How many of the entry's first ``n`` positions still hold the request's K/V."""
        if n <= 0:
            return 0
        held = e.slots[:n]
        ok = (held == self.table[table_row, :n]) & (e.stamps[:n] == self.pool.stamp[held])
        return n if bool(ok.all()) else int((~ok).to(torch.int8).argmax())

    def _grow(self, seq_id: int, e: _Entry | None, need: int) -> _Entry | None:
        """The entry with capacity for ``need`` positions (kept positions copied), within the
        budget after evicting entries this step does not use; None (entry dropped) if not."""
        old = e.capacity if e is not None else 0
        tight = min(-(-need // TILE) * TILE, self.max_context)
        roomy = min(-(-(need + max(HEADROOM, need // 4)) // TILE) * TILE, self.max_context)
        for cap in (roomy, tight):
            while self.tokens - old + cap > self.max_tokens and self._evict(seq_id):
                pass
            if self.tokens - old + cap <= self.max_tokens:
                return self._reallocate(seq_id, e, cap)
        self.entries.pop(seq_id, None)
        return None

    def _evict(self, keep: int) -> bool:
        """Drop the least recently used entry not planned this step (other than ``keep``)."""
        idle = [(e.used, s) for s, e in self.entries.items()
                if s != keep and e.used < self.step]
        if not idle:
            return False
        del self.entries[min(idle)[1]]
        return True

    def _reallocate(self, seq_id: int, e: _Entry | None, cap: int) -> _Entry:
        pool = self.pool
        kvh, d = pool.k[0].shape[1], pool.k[0].shape[2]
        layers = len(pool.k)
        k = [torch.empty(kvh, cap, d, dtype=pool.dtype, device=pool.device) for _ in range(layers)]
        v = [torch.empty(kvh, cap, d, dtype=pool.dtype, device=pool.device) for _ in range(layers)]
        slots = torch.zeros(cap, dtype=torch.int64, device=pool.device)
        stamps = torch.zeros(cap, dtype=torch.int64, device=pool.device)
        n = 0
        if e is not None:
            n = e.length
            for layer in range(layers):
                k[layer][:, :n] = e.k[layer][:, :n]
                v[layer][:, :n] = e.v[layer][:, :n]
            slots[:n], stamps[:n] = e.slots[:n], e.stamps[:n]
        new = _Entry(k, v, slots, stamps, length=n, used=self.step)
        self.entries[seq_id] = new
        return new

    def _gather(self, e: _Entry, table_row: int, start: int, end: int) -> None:
        """Positions ``start .. end`` of the request, every layer, from the pool."""
        slots = self.table[table_row, start:end]
        for layer in range(len(self.pool.k)):
            e.k[layer][:, start:end] = self.pool.k[layer].index_select(0, slots).transpose(0, 1)
            e.v[layer][:, start:end] = self.pool.v[layer].index_select(0, slots).transpose(0, 1)
        e.slots[start:end] = slots
        e.stamps[start:end] = self.pool.stamp[slots]
        self.gathered_positions += end - start


def mirror_split(seq_lens: list[int], prefix_lens: list[int], extend_lens: list[int],
                 held: list[bool], table_rows: torch.Tensor, table: torch.Tensor,
                 max_tokens: int) -> list[int]:
    """Indices (into the lists) of the short group's members to attend apart, the longest
    first: a prompt's chunk (more than :data:`CHUNK_EXTEND` new tokens, or more than one where
    ``held``: it has a :class:`PrefillKV` entry) of at least :data:`MIN_APART` positions and
    :data:`LONG_FACTOR` times the rest's longest (it would make the mirror reallocate every row
    to its length as it grows: ~3 s a time for 42k positions on the embedded model), then any
    member while the rest would not fit a decode mirror of ``max_tokens`` positions (rows x the
    longest row, after the prefix all rest share)."""
    order = sorted(range(len(seq_lens)), key=lambda j: seq_lens[j])
    apart: list[int] = []
    while order:
        j = order[-1]
        rest = max((seq_lens[x] for x in order[:-1]), default=0)
        chunk = extend_lens[j] > CHUNK_EXTEND or (extend_lens[j] > 1 and held[j])
        if chunk and seq_lens[j] >= MIN_APART and seq_lens[j] > LONG_FACTOR * rest:
            apart.append(order.pop())
            continue
        longest = -(-seq_lens[j] // TILE) * TILE
        if len(order) * longest <= max_tokens:
            break
        common = _common_prefix(table[table_rows[order]], min(prefix_lens[x] for x in order))
        if len(order) * (longest - common) <= max_tokens:
            break
        apart.append(order.pop())
    return apart


def _common_prefix(rows: torch.Tensor, n: int) -> int:
    """The positions (of the first ``n``) that all ``rows`` hold in the same slots, 0 if fewer
    than :data:`MIN_SHARED` (or one row: nothing is shared)."""
    if rows.shape[0] < 2 or n < MIN_SHARED:
        return 0
    rows = rows[:, :n]
    diff = (rows != rows[0]).any(0)
    p = int(diff.to(torch.int8).argmax()) if bool(diff.any()) else n
    return p if p >= MIN_SHARED else 0
