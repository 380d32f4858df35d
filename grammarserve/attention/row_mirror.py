"""The decode mirror of the fused CPU attention: one row per decoding sequence, kept across steps.

Like :class:`~grammarserve.attention.kv_mirror.KVMirror` it holds the decoding requests' K/V
contiguous (positions ``base ..`` of each sequence; the shared prefix before ``base`` lives in
``SharedPrefixKV``), so that decode attention streams it instead of gathering from the token-slot
pool. Unlike it, a change of membership does not rebuild it: the fused kernel finds each query's
row through an index (``qb``), so a sequence keeps its row while it decodes, a new sequence takes a
free row and only that row is gathered from the pool, and a finished one leaves its row to be
reused. Continuous batching changes membership on most steps while requests arrive and finish; a
full rebuild then copied every row's K/V on every such step (64 rows of 600 tokens: 1.7 GB).

A finished sequence's row keeps its K/V until another sequence takes it, with the pool slots (and
their allocation stamps, ``KVPool.stamp``) of every position it holds: a new sequence whose first
positions sit in the same slots, allocated no later than the copy (the next request behind a
cached prompt: the same tools, system prompt or conversation so far), takes that row and only the
positions after the common part are gathered (a 60-tool prompt: 5.2k positions, ~240 MB over 30
layers, not copied again).

K is stored in the kernel's tiles of 16 keys ``[R, kv_heads, S/16, head_dim, 16]`` and V as
``[R, kv_heads, S, head_dim]``; ``R`` rows and ``S`` positions (whole tiles) grow when needed, up
to ``max_tokens`` in all (a reallocation copies the rows once).
"""

from __future__ import annotations

import torch
from grammarserve_kernels.decode_attn import KEY_TILE

from grammarserve.attention.kv_pool import KVPool

HEADROOM = 64  # positions added past the longest sequence when the capacity grows
MIN_REUSE = 64  # a free row is taken for its positions in common only from this many on


class RowMirror:
    """Rows of decode K/V for the fused kernel (see the module docstring)."""

    def __init__(self, pool: KVPool, table: torch.Tensor, max_tokens: int,
                 max_context: int) -> None:
        self.pool = pool
        self.table = table  # the request-to-token table: slots of each sequence's positions
        self.max_tokens = max_tokens
        self.max_context = max_context
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.rows = 0  # R
        self.capacity = 0  # S
        self.base = -1
        self._row_of: dict[int, int] = {}  # seq_id -> row
        self._seq_of: list[int | None] = []  # row -> seq_id
        self._len: list[int] = []  # row -> positions mirrored (from base)
        self._used: list[int] = []  # row -> last step that used it
        # [R, S] pool slot and its stamp at copy time of each mirrored position (valid up to _len)
        self._slots = torch.zeros(0, 0, dtype=torch.int64)
        self._stamps = torch.zeros(0, 0, dtype=torch.int64)
        self._step = 0
        # A new object whenever the tensors in k and v are replaced (callers cache addresses).
        self.generation = object()
        self.reallocations = 0
        self.gathered_rows = 0
        self.gathered_positions = 0
        self.reused_positions = 0  # positions a new sequence found in a finished one's row

    def plan(self, seq_ids: list[int], prefix_lens: list[int], extend_lens: list[int],
             table_rows: torch.Tensor, base: int = 0) -> list[int] | None:
        """Rows for this step's sequences (``table_rows``: their request-to-token table rows),
        with every position before this step's new tokens mirrored (gathered from the pool
        where missing); None when the group does not fit in ``max_tokens``."""
        self._step += 1
        need = max(p + e for p, e in zip(prefix_lens, extend_lens)) - base
        if base != self.base:  # another shared prefix: every row's positions move
            self._row_of, self.base = {}, base
            self._seq_of = [None] * self.rows
            self._len = [0] * self.rows
        if not self._fit(len(seq_ids), need, base):
            return None
        present = {s for s in seq_ids if s >= 0}
        rows: list[int] = []
        for sid, p, e, trow in zip(seq_ids, prefix_lens, extend_lens, table_rows.tolist()):
            row = self._row_of.get(sid) if sid >= 0 else None
            if row is None:
                row, kept = self._reuse_row(present, rows, int(trow), p - base)
                if row < 0:
                    row, kept = self._free_row(present, rows), 0
                old = self._seq_of[row]
                if old is not None:
                    self._row_of.pop(old, None)
                self._seq_of[row], self._len[row] = sid, kept
                self.reused_positions += kept
                if sid >= 0:
                    self._row_of[sid] = row
            have, want = self._len[row], p - base
            if have < want:  # positions computed outside the mirror (or a new row): the pool
                self._gather(row, int(trow), have, want)
            self._len[row] = want + e  # this step's forward writes the new tokens
            self._used[row] = self._step
            rows.append(row)
        self._record(rows, prefix_lens, extend_lens, table_rows)
        return rows

    def _record(self, rows: list[int], prefix_lens: list[int], extend_lens: list[int],
                table_rows: torch.Tensor) -> None:
        """Note the slots (and their stamps) of this step's new tokens (already in the table)."""
        ext = torch.tensor(extend_lens)
        total = int(ext.sum())
        if total == 0:
            return
        first = torch.tensor(prefix_lens) - self.base
        offsets = torch.arange(total) - (torch.cumsum(ext, 0) - ext).repeat_interleave(ext)
        pos = first.repeat_interleave(ext) + offsets
        r = torch.tensor(rows).repeat_interleave(ext)
        slots = self.table[table_rows.repeat_interleave(ext), self.base + pos]
        self._slots[r, pos] = slots
        self._stamps[r, pos] = self.pool.stamp[slots]

    def _reuse_row(self, present: set[int], taken: list[int], table_row: int,
                   want: int) -> tuple[int, int]:
        """A row no sequence of this step holds whose first positions are this new sequence's
        first ``want`` positions (the same slots, not reallocated since they were copied), and
        how many: the row with the most, at least :data:`MIN_REUSE`; (-1, 0) if none."""
        if want < MIN_REUSE or not self.rows:
            return -1, 0
        slots = self.table[table_row, self.base:self.base + want]
        best, best_n = -1, MIN_REUSE - 1
        for row in (self._slots[:, 0] == slots[0]).nonzero().flatten().tolist():
            sid = self._seq_of[row]
            n = min(self._len[row], want)
            if row in taken or (sid is not None and sid in present) or n <= best_n:
                continue
            old = self._slots[row, :n]
            ok = (old == slots[:n]) & (self._stamps[row, :n] == self.pool.stamp[old])
            n = n if bool(ok.all()) else int((~ok).to(torch.int8).argmax())
            if n > best_n:
                best, best_n = row, n
        return (best, best_n) if best >= 0 else (-1, 0)

    def write_new(self, layer: int, rows: torch.Tensor, pos: torch.Tensor,
                  slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy this step's new tokens (already in the pool at ``slots``) of ``layer`` to mirror
        ``rows`` at positions ``pos``; returns the layer's K and V."""
        k, v = self.k[layer], self.v[layer]
        k[rows, :, pos // KEY_TILE, :, pos % KEY_TILE] = self.pool.k[layer].index_select(0, slots)
        v[rows, :, pos] = self.pool.v[layer].index_select(0, slots)
        return k, v

    def _fit(self, n: int, need: int, base: int) -> bool:
        """Grow rows and positions to hold ``n`` rows of ``need`` positions, within budget."""
        if n <= self.rows and need <= self.capacity:
            return True
        limit = -(-(self.max_context - base) // KEY_TILE) * KEY_TILE
        tight = -(-need // KEY_TILE) * KEY_TILE
        cap = self.capacity
        if need > cap:  # geometric growth: a reallocation copies every row
            cap = min(-(-(need + max(HEADROOM, need // 4)) // KEY_TILE) * KEY_TILE, limit)
        rows = max(self.rows, n)
        if n > self.rows:  # likewise: rows double (sequences join a few per step)
            rows = max(n, min(2 * self.rows, self.max_tokens // cap))
        # Within the budget: drop rows of sequences not in this step, then as much of the
        # headroom as fits (not all of it: growing by one tile at a time would copy every row
        # again every 16 steps).
        fit = self.max_tokens // n // KEY_TILE * KEY_TILE
        for r, c in ((rows, cap), (n, cap), (n, min(cap, fit))):
            if c >= tight and r * c <= self.max_tokens:
                self._reallocate(r, c)
                return True
        return False

    def _reallocate(self, rows: int, cap: int) -> None:
        pool = self.pool
        kvh, d = pool.k[0].shape[1], pool.k[0].shape[2]
        keep_rows, keep = min(rows, self.rows), min(cap, self.capacity)  # keep: whole tiles
        for layer in range(len(pool.k)):
            k = torch.zeros(rows, kvh, cap // KEY_TILE, d, KEY_TILE, dtype=pool.dtype)
            v = torch.zeros(rows, kvh, cap, d, dtype=pool.dtype)
            if layer < len(self.k) and keep_rows:
                k[:keep_rows, :, :keep // KEY_TILE] = self.k[layer][:keep_rows, :, :keep // KEY_TILE]
                v[:keep_rows, :, :keep] = self.v[layer][:keep_rows, :, :keep]
                self.k[layer], self.v[layer] = k, v
            elif layer < len(self.k):
                self.k[layer], self.v[layer] = k, v
            else:
                self.k.append(k)
                self.v.append(v)
        for row in range(rows, self.rows):  # rows dropped: their sequences are forgotten
            sid = self._seq_of[row]
            if sid is not None:
                self._row_of.pop(sid, None)
        extra = rows - keep_rows
        self._seq_of = self._seq_of[:keep_rows] + [None] * extra
        # a shrunk capacity cuts rows of absent sequences: gathered again if they come back
        self._len = [min(n, cap) for n in self._len[:keep_rows]] + [0] * extra
        self._used = self._used[:keep_rows] + [0] * extra
        slots = torch.zeros(rows, cap, dtype=torch.int64)
        stamps = torch.zeros(rows, cap, dtype=torch.int64)
        slots[:keep_rows, :keep] = self._slots[:keep_rows, :keep]
        stamps[:keep_rows, :keep] = self._stamps[:keep_rows, :keep]
        self._slots, self._stamps = slots, stamps
        self.rows, self.capacity = rows, cap
        self.generation = object()
        self.reallocations += 1

    def _free_row(self, present: set[int], taken: list[int]) -> int:
        """A row no sequence of this step holds: unused first, else the least recently used."""
        best, best_used = -1, None
        for row in range(self.rows):
            sid = self._seq_of[row]
            if row in taken or (sid is not None and sid in present):
                continue
            if sid is None:
                return row
            if best_used is None or self._used[row] < best_used:
                best, best_used = row, self._used[row]
        assert best >= 0, "the mirror has a row for every sequence of the step"
        return best

    def _gather(self, row: int, table_row: int, start: int, end: int) -> None:
        """Positions ``start .. end`` (from base) of ``row``, every layer, from the pool."""
        if end <= start:
            return
        slots = self.table[table_row, self.base + start:self.base + end]
        pos = torch.arange(start, end)
        tile, lane = pos // KEY_TILE, pos % KEY_TILE
        for layer in range(len(self.k)):
            self.k[layer][row, :, tile, :, lane] = self.pool.k[layer].index_select(0, slots)
            self.v[layer][row, :, start:end] = self.pool.v[layer].index_select(0, slots).transpose(
                0, 1)
        self._slots[row, start:end] = slots
        self._stamps[row, start:end] = self.pool.stamp[slots]
        self.gathered_rows += 1
        self.gathered_positions += end - start
