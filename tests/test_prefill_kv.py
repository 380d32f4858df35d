"""A long prompt prefilled in chunks beside decode rows (grammarserve/attention/prefill_kv.py and
its use in ``TorchSDPABackend``): the chunk leaves the decode rows' mirrored group when it would
push the mirror past its budget, its attention reads the per-request contiguous K/V and equals
plain causal attention over the pool, the decode rows' results do not change with it riding in
the step, and the per-request copy is dropped when the request leaves the path."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grammarserve.attention.backend import LOW_PRECISION_MIN_QUERIES, TorchSDPABackend
from grammarserve.attention.forward_batch import ForwardBatch
from grammarserve.attention.kv_pool import KVPool, ReqToTokenPool
from grammarserve.attention.prefill_kv import KEEP_STEPS, PrefillKV, mirror_split
from grammarserve.attention.row_mirror import RowMirror

LAYERS, H, KVH, D = 2, 4, 2, 64
MIRROR_TOKENS = 1024  # 5 rows of the long prompt's ~600 positions do not fit: 4 rows of 64 do
LONG = 7  # seq id of the long prompt (table row 4)


@dataclass
class Req:
    seq_id: int
    table_row: int
    length: int  # positions whose K/V is in the pool


def _setup() -> tuple[KVPool, ReqToTokenPool, list[Req]]:
    torch.manual_seed(0)
    pool = KVPool(capacity=4000, num_layers=LAYERS, num_kv_heads=KVH, head_dim=D,
                  dtype=torch.float32)
    table = ReqToTokenPool(max_reqs=8, max_context=1024)
    reqs = [Req(s, s, 40 + 7 * s) for s in range(4)] + [Req(LONG, 4, 0)]
    for r in reqs[:4]:  # decode rows: their contexts are in the pool
        slots = pool.alloc(r.length)
        table.write(r.table_row, 0, slots)
        for layer in range(LAYERS):
            pool.k[layer][slots] = torch.randn(r.length, KVH, D)
            pool.v[layer][slots] = torch.randn(r.length, KVH, D)
    return pool, table, reqs


def _batch(pool: KVPool, table: ReqToTokenPool, reqs: list[Req], ext: list[int]) -> ForwardBatch:
    """The forward batch of ``reqs`` bringing ``ext`` new tokens each (slots allocated and
    written in the table, as the model runner does; one allocation per request, interleaved)."""
    locs = []
    for r, n in zip(reqs, ext):
        slots = pool.alloc(n)
        table.write(r.table_row, r.length, slots)
        locs.append(slots)
    total = sum(ext)
    return ForwardBatch(torch.zeros(total, dtype=torch.int64), torch.zeros(total, dtype=torch.int64),
                        torch.cat(locs), [r.table_row for r in reqs], [r.length for r in reqs],
                        list(ext), torch.zeros(0, dtype=torch.int64), [r.seq_id for r in reqs])


def _run(attn: TorchSDPABackend, batch: ForwardBatch,
         qkv: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    attn.prepare(batch)
    return [attn.forward(layer, *qkv[layer]) for layer in range(LAYERS)]


def _qkv(total: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    return [(torch.randn(total, H, D), torch.randn(total, KVH, D), torch.randn(total, KVH, D))
            for _ in range(LAYERS)]


def _reference(pool: KVPool, table: ReqToTokenPool, batch: ForwardBatch, layer: int,
               q: torch.Tensor) -> torch.Tensor:
    """Plain causal attention of every new query over its request's whole sequence in the
    pool, in float64."""
    out = torch.empty(q.shape, dtype=torch.float64)
    for start, row, p, n in zip(batch.starts, batch.req_pool_indices, batch.prefix_lens,
                                batch.extend_lens):
        slots = table.table[row, :p + n]
        k = pool.k[layer][slots].double().repeat_interleave(H // KVH, 1).transpose(0, 1)
        v = pool.v[layer][slots].double().repeat_interleave(H // KVH, 1).transpose(0, 1)
        qq = q[start:start + n].double().transpose(0, 1)  # [H, n, D]
        s = qq @ k.transpose(1, 2) / D ** 0.5
        allowed = torch.arange(p + n)[None, :] <= (p + torch.arange(n))[:, None]
        s = s.masked_fill(~allowed, float("-inf"))
        out[start:start + n] = (s.softmax(-1) @ v).transpose(0, 1)
    return out


def _advance(reqs: list[Req], ext: list[int]) -> None:
    for r, n in zip(reqs, ext):
        r.length += n


def test_chunked_prefill_beside_decode_rows_matches_causal_attention() -> None:
    pool, table, reqs = _setup()
    attn = TorchSDPABackend(pool, table, mirror_tokens=MIRROR_TOKENS)
    assert isinstance(attn.mirror, RowMirror) and attn.prefill_kv is not None
    chunks = [200, 200, 100, 32, 32, 8, 1, 16, 3]  # the first without a prefix: causal group
    for c in chunks:
        ext = [1, 1, 1, 1, c]
        batch = _batch(pool, table, reqs, ext)
        qkv = _qkv(sum(ext))
        outs = _run(attn, batch, qkv)
        for layer in range(LAYERS):
            want = _reference(pool, table, batch, layer, qkv[layer][0])
            torch.testing.assert_close(outs[layer].double(), want, atol=2e-5, rtol=1e-4)
        if reqs[4].length + c > MIRROR_TOKENS // 5:  # would not fit: alone, on PrefillKV
            assert LONG in attn.prefill_kv.entries
        _advance(reqs, ext)
    # the prefix was gathered once (the first chunk's positions), then only appended
    assert attn.prefill_kv.gathered_positions == 200
    assert attn.mirror.capacity * len(reqs[:4]) <= MIRROR_TOKENS  # the decode rows stayed mirrored


def test_decode_rows_do_not_change_with_a_long_chunk_in_the_step() -> None:
    pool, table, reqs = _setup()
    alone = TorchSDPABackend(pool, table, mirror_tokens=MIRROR_TOKENS)
    mixed = TorchSDPABackend(pool, table, mirror_tokens=MIRROR_TOKENS)
    b = _batch(pool, table, reqs[4:], [500])  # the long prompt's first chunk
    _run(mixed, b, _qkv(500))
    _advance(reqs[4:], [500])
    for _ in range(3):
        ext = [1, 1, 1, 1, 24]
        batch = _batch(pool, table, reqs, ext)
        qkv = _qkv(sum(ext))
        dec = ForwardBatch(batch.input_ids[:4], batch.positions[:4], batch.out_cache_loc[:4],
                           batch.req_pool_indices[:4], batch.prefix_lens[:4],
                           batch.extend_lens[:4], batch.logit_rows, batch.seq_ids[:4])
        want = _run(alone, dec, [(q[:4], k[:4], v[:4]) for q, k, v in qkv])
        got = _run(mixed, batch, qkv)
        for layer in range(LAYERS):
            assert torch.equal(got[layer][:4], want[layer])
        _advance(reqs, ext)


def test_the_per_request_copy_is_dropped() -> None:
    pool, table, reqs = _setup()
    attn = TorchSDPABackend(pool, table, mirror_tokens=MIRROR_TOKENS)
    pkv = attn.prefill_kv
    assert pkv is not None
    for ext in ([1, 1, 1, 1, 400], [1, 1, 1, 1, 32]):
        _run(attn, _batch(pool, table, reqs, ext), _qkv(sum(ext)))
        _advance(reqs, ext)
    assert LONG in pkv.entries and pkv.tokens >= reqs[4].length
    # its prefill done and the others gone: it decodes in the mirror, the copy is dropped
    _run(attn, _batch(pool, table, reqs[4:], [1]), _qkv(1))
    _advance(reqs[4:], [1])
    assert pkv.entries == {} and pkv.tokens == 0
    # back on the path, then absent for KEEP_STEPS steps: dropped
    _run(attn, _batch(pool, table, reqs, [1] * 4 + [8]), _qkv(12))
    _advance(reqs, [1] * 4 + [8])
    assert LONG in pkv.entries
    for _ in range(KEEP_STEPS + 1):
        _run(attn, _batch(pool, table, reqs[:4], [1] * 4), _qkv(4))
        _advance(reqs[:4], [1] * 4)
    assert pkv.entries == {}
    pkv.plan(LONG, 4, reqs[4].length, 0)
    pkv.release(LONG)
    assert pkv.entries == {}


def test_stale_positions_are_gathered_again_and_the_budget_holds() -> None:
    pool, table, reqs = _setup()
    pkv = PrefillKV(pool, table.table, max_tokens=300, max_context=1024)
    pkv.begin([])
    assert pkv.plan(0, 0, 40, 0) and pkv.gathered_positions == 40
    for layer in range(LAYERS):
        k, v = pkv.append(layer, 0, table.table[0, 40:40])
        assert torch.equal(k, pool.k[layer][table.table[0, :40]].transpose(0, 1))
    pkv.begin([])
    pool.free(table.table[0, 30:40])  # positions 30.. handed to another request
    table.write(0, 30, pool.alloc(10))
    assert pkv.plan(0, 0, 40, 0) and pkv.gathered_positions == 50
    pkv.begin([])
    assert not pkv.plan(1, 1, 500, 0) and 1 not in pkv.entries  # over the budget: no entry
    assert pkv.tokens <= 300


def test_mirror_split_keeps_a_shared_prefix_group_together() -> None:
    table = torch.zeros(3, 1000, dtype=torch.int64)
    table[:, :600] = torch.arange(1, 601)  # three rows behind one 600-token prompt
    rows, one, no = torch.arange(3), [1, 1, 1], [False] * 3
    assert mirror_split([610, 620, 630], [609, 619, 629], one, no, rows, table, 200) == []
    table[1, :600] = torch.arange(1001, 1601)  # nothing shared: the longest rows leave
    assert mirror_split([610, 620, 630], [609, 619, 629], one, no, rows, table, 1000) == [2, 1]
    assert mirror_split([40, 50, 630], [39, 49, 600], one, no, rows, table, 1000) == [2]


def test_mirror_split_sets_a_long_prompts_chunk_apart() -> None:
    table = torch.zeros(3, 4000, dtype=torch.int64)
    rows, big = torch.arange(3), 10**6
    # a 32-token chunk at 3,000 positions beside rows of ~100: apart though the mirror fits
    assert mirror_split([90, 100, 3032], [89, 99, 3000], [1, 1, 32], [False] * 3, rows, table,
                        big) == [2]
    # a 4-token chunk: apart only once the request has an entry (it was apart before)
    assert mirror_split([90, 100, 3004], [89, 99, 3000], [1, 1, 4], [False] * 3, rows, table,
                        big) == []
    assert mirror_split([90, 100, 3004], [89, 99, 3000], [1, 1, 4], [False, False, True],
                        rows, table, big) == [2]
    # its decode steps (one token), a short prompt's chunk, a chunk beside rows as long: kept
    for seq, ext in (([90, 100, 3001], [1, 1, 1]), ([90, 100, 300], [1, 1, 32]),
                     ([2000, 2100, 3032], [1, 1, 32])):
        assert mirror_split(seq, [s - e for s, e in zip(seq, ext)], ext, [False, False, True],
                            rows, table, big) == []


def test_long_query_groups_attend_in_the_prefill_dtype_and_short_ones_exactly() -> None:
    """``prefill_dtype`` (bf16 where the linears' prefill is bf16): a prompt's causal group and
    a lone chunk of ``LOW_PRECISION_MIN_QUERIES`` queries or more attend in bf16 (within bf16's
    rounding of the float64 reference); shorter ones and the decode rows stay fp32, bit for bit
    the fp32 backend's."""
    pool, table, reqs = _setup()
    low = TorchSDPABackend(pool, table, mirror_tokens=MIRROR_TOKENS,
                           prefill_dtype=torch.bfloat16)
    exact = TorchSDPABackend(pool, table, mirror_tokens=MIRROR_TOKENS)
    for c in (LOW_PRECISION_MIN_QUERIES, LOW_PRECISION_MIN_QUERIES, 100):
        ext = [1, 1, 1, 1, c]
        batch = _batch(pool, table, reqs, ext)
        qkv = _qkv(sum(ext))
        got, fp32 = _run(low, batch, qkv), _run(exact, batch, qkv)
        for layer in range(LAYERS):
            want = _reference(pool, table, batch, layer, qkv[layer][0])
            assert torch.equal(got[layer][:4], fp32[layer][:4])  # the decode rows
            if c >= LOW_PRECISION_MIN_QUERIES:
                torch.testing.assert_close(got[layer].double(), want, atol=3e-2, rtol=3e-2)
                assert not torch.equal(got[layer][4:], fp32[layer][4:])
            else:
                assert torch.equal(got[layer], fp32[layer])
        _advance(reqs, ext)
