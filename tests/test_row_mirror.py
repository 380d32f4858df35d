"""The fused kernel's decode mirror (grammarserve/attention/row_mirror.py) on a small pool with
known values: rows kept across steps and across changes of membership, only new or behind rows
gathered, capacity and row growth, eviction within the token budget, a new shared base."""

from __future__ import annotations

import torch
from grammarserve_kernels.decode_attn import untile_keys

from grammarserve.attention.kv_pool import KVPool, ReqToTokenPool
from grammarserve.attention.row_mirror import RowMirror

LAYERS, KVH, D = 2, 2, 4


def _setup(max_tokens: int = 4096) -> tuple[KVPool, ReqToTokenPool, RowMirror]:
    pool = KVPool(capacity=400, num_layers=LAYERS, num_kv_heads=KVH, head_dim=D,
                  dtype=torch.float32)
    for layer in range(LAYERS):  # every slot's K/V tells where it came from
        slot = torch.arange(401, dtype=torch.float32)[:, None, None]
        pool.k[layer][:] = slot + 1000 * layer
        pool.v[layer][:] = -(slot + 1000 * layer)
    table = ReqToTokenPool(max_reqs=8, max_context=256)
    return pool, table, RowMirror(pool, table.table, max_tokens, 256)


def _add(pool: KVPool, table: ReqToTokenPool, row: int, n: int) -> None:
    table.write(row, 0, pool.alloc(n))


def _check(mirror: RowMirror, table: ReqToTokenPool, mrow: int, trow: int, n: int,
           base: int = 0) -> None:
    """Mirror row ``mrow`` holds table row ``trow``'s positions base .. base + n."""
    slots = table.table[trow, base:base + n].float()
    for layer in range(LAYERS):
        k = untile_keys(mirror.k[layer])[mrow, :, :n]  # [KVH, n, D]
        v = mirror.v[layer][mrow, :, :n]
        want = (slots + 1000 * layer)[None, :, None].expand(KVH, n, D)
        assert torch.equal(k, want) and torch.equal(v, -want)


def _step(mirror: RowMirror, table: ReqToTokenPool, members: dict[int, int],
          lens: dict[int, int], base: int = 0) -> list[int] | None:
    """One decode step of ``members`` (seq id -> table row) at ``lens``; the forward's writes of
    the new token are simulated from the pool, as ``write_new`` does."""
    ids = list(members)
    rows = mirror.plan(ids, [lens[s] for s in ids], [1] * len(ids),
                       torch.tensor([members[s] for s in ids]), base=base)
    if rows is not None:
        slots = torch.stack([table.table[members[s], lens[s]] for s in ids])
        for layer in range(LAYERS):
            mirror.write_new(layer, torch.tensor(rows), torch.tensor([lens[s] - base for s in ids]),
                             slots)
        for s in ids:
            lens[s] += 1
    return rows


def test_rows_are_kept_and_only_newcomers_are_gathered() -> None:
    pool, table, mirror = _setup()
    for r in range(4):
        _add(pool, table, r, 60)
    lens = {10: 20, 11: 30, 12: 25, 13: 40}
    rows = _step(mirror, table, {10: 0, 11: 1}, lens)
    assert rows == [0, 1] and mirror.gathered_rows == 2
    _step(mirror, table, {10: 0, 11: 1}, lens)
    rows = _step(mirror, table, {11: 1, 12: 2, 10: 0}, lens)  # a newcomer, another order
    assert rows == [1, 2, 0] and mirror.gathered_rows == 3
    _step(mirror, table, {12: 2}, lens)  # 10 and 11 sit out a step: their rows stay
    rows = _step(mirror, table, {10: 0, 11: 1, 12: 2}, lens)
    assert rows == [0, 1, 2]  # each sequence back in its own row
    assert mirror.gathered_rows == 3
    for sid, trow in ((10, 0), (11, 1), (12, 2)):
        _check(mirror, table, rows[[10, 11, 12].index(sid)], trow, lens[sid])


def test_a_row_behind_the_pool_is_completed_and_a_finished_row_reused() -> None:
    pool, table, mirror = _setup()
    for r in range(3):
        _add(pool, table, r, 80)
    lens = {1: 10, 2: 12}
    _step(mirror, table, {1: 0, 2: 1}, lens)
    lens[1] += 5  # five tokens of 1 computed outside the mirror (a long jump-forward span)
    rows = _step(mirror, table, {1: 0, 2: 1}, lens)
    assert rows is not None
    _check(mirror, table, rows[0], 0, lens[1])
    rows = _step(mirror, table, {1: 0, 3: 2}, lens | {3: 7})  # 2 finished, 3 takes its row
    assert rows == [0, 1]
    _check(mirror, table, 1, 2, 8)


def test_capacity_and_rows_grow_and_the_budget_evicts_absent_rows() -> None:
    pool, table, mirror = _setup(max_tokens=4 * 96)
    for r in range(5):
        _add(pool, table, r, 70)
    lens = {0: 10, 1: 10}
    _step(mirror, table, {0: 0, 1: 1}, lens)
    assert (mirror.rows, mirror.capacity) == (2, 80)  # 11 + 64 headroom, whole tiles
    lens |= {2: 10, 3: 10}
    rows = _step(mirror, table, {0: 0, 1: 1, 2: 2, 3: 3}, lens)
    assert rows is not None and mirror.rows == 4 and mirror.reallocations == 2
    _check(mirror, table, rows[0], 0, lens[0])  # copied by the reallocation
    # five rows of 69 positions: 5 x 80 > 384 even without headroom
    assert _step(mirror, table, {s: s for s in range(5)}, {s: 68 for s in range(5)}) is None
    lens[4] = 10  # 4 joins while 2 and 3 sit out: their rows are taken, within the budget
    rows = _step(mirror, table, {0: 0, 1: 1, 4: 4}, lens)
    assert rows is not None and mirror.rows * mirror.capacity <= 4 * 96
    _check(mirror, table, rows[2], 4, lens[4])


def test_a_new_shared_base_restarts_every_row() -> None:
    pool, table, mirror = _setup()
    for r in range(2):
        _add(pool, table, r, 90)
    lens = {0: 40, 1: 40}
    _step(mirror, table, {0: 0, 1: 1}, lens)
    gathered = mirror.gathered_rows
    rows = _step(mirror, table, {0: 0, 1: 1}, lens, base=16)
    assert rows is not None and mirror.gathered_rows == gathered + 2
    _check(mirror, table, rows[1], 1, lens[1] - 16, base=16)


def test_the_headroom_gives_way_before_the_budget_refuses() -> None:
    pool, table, mirror = _setup(max_tokens=2 * 48)
    for r in range(3):
        _add(pool, table, r, 100)
    lens = {0: 30, 1: 40}
    rows = _step(mirror, table, {0: 0, 1: 1}, lens)  # 41 + 64 headroom would not fit: 48
    assert rows is not None and mirror.capacity == 48
    lens[2] = 20  # a third row needs 3 x 48 > 96 tokens: refused
    assert _step(mirror, table, {0: 0, 1: 1, 2: 2}, lens) is None
    rows = _step(mirror, table, {2: 2}, lens)  # 0 and 1 absent: a row of theirs is reused
    assert rows is not None
    _check(mirror, table, rows[0], 2, lens[2])


def test_a_tight_budget_grows_by_what_fits_not_by_one_tile() -> None:
    pool, table, mirror = _setup(max_tokens=2 * 160)
    for r in range(2):
        _add(pool, table, r, 170)
    lens = {0: 40, 1: 40}
    _step(mirror, table, {0: 0, 1: 1}, lens)
    assert mirror.capacity == 112  # 41 + 64 headroom, whole tiles
    grown = mirror.reallocations
    for n in range(41, 160):  # past 112: 2 x (113 + 64) does not fit the budget, 2 x 160 does
        lens = {0: n, 1: n}
        assert _step(mirror, table, {0: 0, 1: 1}, lens) is not None
    assert (mirror.reallocations, mirror.capacity) == (grown + 1, 160)  # not 128, 144, 160
    _check(mirror, table, 0, 0, lens[0])


def _check_pool(mirror: RowMirror, pool: KVPool, table: ReqToTokenPool, mrow: int, trow: int,
                n: int) -> None:
    """Mirror row ``mrow`` holds exactly the pool's K/V at table row ``trow``'s first n slots."""
    slots = table.table[trow, :n]
    for layer in range(LAYERS):
        assert torch.equal(untile_keys(mirror.k[layer])[mrow, :, :n],
                           pool.k[layer][slots].transpose(0, 1))
        assert torch.equal(mirror.v[layer][mrow, :, :n], pool.v[layer][slots].transpose(0, 1))


def test_a_new_sequence_behind_a_finished_ones_prefix_gathers_only_the_rest() -> None:
    pool, table, mirror = _setup()
    _add(pool, table, 0, 100)
    lens = {1: 90}
    for _ in range(3):
        _step(mirror, table, {1: 0}, lens)
    # 1 finished; 2 shares its first 80 slots (the prefix cache), then slots of its own
    table.write(1, 0, table.table[0, :80].clone())
    table.write(1, 80, pool.alloc(30))
    gathered = mirror.gathered_positions
    rows = _step(mirror, table, {2: 1}, {2: 95})
    assert rows == [0] and mirror.reused_positions == 80
    assert mirror.gathered_positions == gathered + 15  # positions 80 .. 95 only
    _check_pool(mirror, pool, table, 0, 1, 96)
    _check(mirror, table, 0, 1, 96)


def test_reallocated_slots_are_gathered_again_not_reused() -> None:
    pool, table, mirror = _setup()
    _add(pool, table, 0, 100)
    _step(mirror, table, {1: 0}, {1: 90})
    prefix = table.table[0, :80].clone()
    rest = pool.alloc(pool.num_free)  # so that the next alloc hands out the slots freed now
    pool.free(prefix[70:].clone())
    again = pool.alloc(10)
    assert torch.equal(again, prefix[70:])
    for layer in range(LAYERS):  # the new owner's K/V in those slots
        pool.k[layer][again] = 7.0 + layer
        pool.v[layer][again] = -7.0 - layer
    pool.free(rest[:40].clone())
    table.write(1, 0, prefix)
    table.write(1, 80, pool.alloc(20))
    rows = _step(mirror, table, {2: 1}, {2: 85})
    assert rows == [0] and mirror.reused_positions == 70  # up to the first reallocated slot
    _check_pool(mirror, pool, table, 0, 1, 86)


def test_a_row_of_another_prefix_is_not_taken_for_reuse() -> None:
    pool, table, mirror = _setup()
    for r in range(3):
        _add(pool, table, r, 100)
    lens = {1: 90, 2: 90}
    _step(mirror, table, {1: 0, 2: 1}, lens)
    table.write(2, 0, table.table[1, :70].clone())  # 3 shares 2's prefix, not 1's
    rows = _step(mirror, table, {3: 2}, {3: 75})
    assert rows == [1] and mirror.reused_positions == 70
    _check_pool(mirror, pool, table, 1, 2, 76)
