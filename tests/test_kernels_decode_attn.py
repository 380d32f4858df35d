"""The fused CPU decode attention (``kernels/decode_attn_cpu.cpp``) against its torch reference,
on every instruction-set build this CPU runs: shared prefixes of any length (none, partial
vector chunks), both head sizes, grouped-query heads, rows seeing different numbers of keys."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F
from grammarserve_kernels.decode_attn import (
    KEY_TILE,
    decode_attention,
    decode_attention_ref,
    tile_keys,
    untile_keys,
)
from grammarserve_kernels.quant_q8 import supported_isas
from isa_helpers import require_isa

can_build = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") and bool(
    shutil.which("c++"))
pytestmark = pytest.mark.skipif(not can_build, reason="needs an AVX2 CPU and a C++ compiler")

CASES = [  # N queries, H heads, KV heads, head dim, shared P, rows B, mirror capacity S
    (8, 9, 3, 64, 300, 8, 40),
    (5, 9, 3, 64, 0, 3, 40),  # no shared prefix (the mirrored-matmul path)
    (3, 8, 2, 128, 37, 2, 20),  # P not a multiple of the vector width
    (12, 9, 3, 64, 70, 4, 50),  # several queries per row (jump-forward spans)
    (1, 4, 4, 64, 1, 1, 1),  # one key of each kind, no grouping
    (6, 9, 3, 64, 0, 6, 130),  # own keys past a vector width, G not a multiple of the block
    (4, 16, 2, 128, 20, 4, 75),  # G = 8 query heads per KV head
    (1, 9, 3, 64, 0, 1, 600),  # one row (a single stream), hundreds of its own keys
    (3, 9, 3, 64, 200, 2, 400),  # long own keys merged with a shared prefix
]


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_fused_decode_attention_matches_reference(isa: str, case: tuple[int, ...]) -> None:
    require_isa(isa)
    n, h, kvh, d, p, b, s = case
    gen = torch.Generator().manual_seed(sum(case))
    q = torch.randn(n, h, d, generator=gen) * 3 / d ** 0.5
    kt, vs = torch.randn(kvh, d, p, generator=gen), torch.randn(kvh, p, d, generator=gen)
    s = -(-s // KEY_TILE) * KEY_TILE  # the mirror's capacity is whole tiles
    kmt = tile_keys(torch.randn(b, kvh, s, d, generator=gen))
    vm = torch.randn(b, kvh, s, d, generator=gen)
    qb = torch.randint(0, b, (n,), generator=gen)
    qlen = torch.randint(1, s + 1, (n,), generator=gen)
    got = decode_attention(q, kt, vs, kmt, vm, qb, qlen, isa=isa)
    torch.testing.assert_close(got, decode_attention_ref(q, kt, vs, kmt, vm, qb, qlen),
                               rtol=1e-5, atol=1e-5)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:  # each output has one owning thread: two threads give the same bits
        assert torch.equal(decode_attention(q, kt, vs, kmt, vm, qb, qlen, isa=isa), got)
    finally:
        torch.set_num_threads(threads)


def test_fused_decode_attention_of_a_query_does_not_depend_on_its_batch() -> None:
    """Without a shared prefix, a query alone and among others (more tasks, another thread's
    share) gives the same bits."""
    isa = supported_isas()[-1][:6]
    gen = torch.Generator().manual_seed(9)
    n, h, kvh, d, b, s = 6, 9, 3, 64, 6, 528
    q = torch.randn(n, h, d, generator=gen) * 3 / d ** 0.5
    kt, vs = torch.empty(kvh, d, 0), torch.empty(kvh, 0, d)
    kmt = tile_keys(torch.randn(b, kvh, s, d, generator=gen))
    vm = torch.randn(b, kvh, s, d, generator=gen)
    qb, qlen = torch.arange(n), torch.tensor([517, 3, 300, 128, 129, 400])
    together = decode_attention(q, kt, vs, kmt, vm, qb, qlen, isa=isa)
    for i in range(n):
        alone = decode_attention(q[i:i + 1], kt, vs, kmt, vm, qb[i:i + 1], qlen[i:i + 1],
                                 isa=isa)
        assert torch.equal(alone[0], together[i])


def test_fused_decode_attention_rejects_what_it_cannot_run() -> None:
    q = torch.randn(2, 4, 80)  # head_dim 80: not built
    kv = torch.randn(1, 2, 4, 80)
    with pytest.raises(ValueError, match="head_dim must be one of"):
        decode_attention(q, torch.empty(0), torch.empty(0), kv, kv, torch.zeros(2),
                         torch.ones(2))
    with pytest.raises(ValueError, match="q must be contiguous fp32"):
        decode_attention(q.double(), torch.empty(0), torch.empty(0), kv, kv, torch.zeros(2),
                         torch.ones(2))
    q, vm = torch.randn(2, 4, 64), torch.randn(1, 2, 16, 64)
    with pytest.raises(ValueError, match="kmt must be"):  # not tiled
        decode_attention(q, torch.empty(0), torch.empty(0), vm, vm, torch.zeros(2),
                         torch.ones(2))


def _span_case(seed: int, rows: list[tuple[int, int]], h: int = 9, kvh: int = 3, d: int = 64,
               p: int = 0) -> tuple[torch.Tensor, ...]:
    """Inputs where each (new tokens n, keys L) of ``rows`` is one mirror row's span: its tokens
    consecutive, seeing L - n + 1 .. L of the row's keys (a prefill over a cached prefix)."""
    gen = torch.Generator().manual_seed(seed)
    s = -(-max(length for _, length in rows) // KEY_TILE) * KEY_TILE
    n = sum(k for k, _ in rows)
    q = torch.randn(n, h, d, generator=gen) * 3 / d ** 0.5
    kt, vs = torch.randn(kvh, d, p, generator=gen), torch.randn(kvh, p, d, generator=gen)
    kmt = tile_keys(torch.randn(len(rows), kvh, s, d, generator=gen))
    vm = torch.randn(len(rows), kvh, s, d, generator=gen)
    qb = torch.cat([torch.full((k,), b) for b, (k, _) in enumerate(rows)])
    qlen = torch.cat([torch.arange(length - k + 1, length + 1) for k, length in rows])
    return q, kt, vs, kmt, vm, qb, qlen


def test_span_over_a_long_cached_prefix_matches_sdpa() -> None:
    """SmolLM2's shapes (9 query heads, 3 KV heads, head_dim 64): the agent's next question, 23
    new tokens after a 5.3k-token cached tool block, against torch SDPA (causal within the span)."""
    q, kt, vs, kmt, vm, qb, qlen = _span_case(34, [(23, 5317)])
    got = decode_attention(q, kt, vs, kmt, vm, qb, qlen)
    length = int(qlen.max())
    keys = untile_keys(kmt)[:, :, :length]  # [1, KVH, L, D]
    mask = torch.arange(length)[None, :] < qlen[:, None]  # [23, L]
    want = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys, vm[:, :, :length],
                                          attn_mask=mask, scale=1.0, enable_gqa=True)
    torch.testing.assert_close(got, want[0].transpose(0, 1), rtol=1e-5, atol=1e-5)


SPANS = [  # rows as (new tokens, keys of the last), heads, KV heads, head dim, shared P
    ([(23, 5317)], 9, 3, 64, 0),
    ([(5, 40), (1, 17), (7, 300), (1, 1), (2, 33)], 9, 3, 64, 0),  # spans past tile edges
    ([(4, 64), (3, 50)], 9, 3, 64, 37),  # behind a shared prefix
    ([(6, 100), (1, 20)], 4, 2, 64, 0),  # G = 2: a block holds two tokens' heads
    ([(5, 70), (2, 19)], 16, 2, 128, 21),  # head_dim 128 (blocks of 2), G = 8
]


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("case", SPANS, ids=[str(c) for c in SPANS])
def test_span_tokens_get_the_bits_they_get_alone(isa: str, case: tuple) -> None:
    """A span's tokens are attended in blocks that mix their heads (no padded query head); each
    query's sums are still its own, in the same order: the same bits as the token alone (one
    block of its G heads), and close to the torch reference."""
    require_isa(isa)
    rows, h, kvh, d, p = case
    q, kt, vs, kmt, vm, qb, qlen = _span_case(len(rows) + h + p, rows, h, kvh, d, p)
    together = decode_attention(q, kt, vs, kmt, vm, qb, qlen, isa=isa)
    for i in range(q.shape[0]):
        alone = decode_attention(q[i:i + 1], kt, vs, kmt, vm, qb[i:i + 1], qlen[i:i + 1],
                                 isa=isa)
        assert torch.equal(alone[0], together[i]), f"token {i}"
    if sum(k for k, _ in rows) <= 16:
        torch.testing.assert_close(together, decode_attention_ref(q, kt, vs, kmt, vm, qb, qlen),
                                   rtol=1e-5, atol=1e-5)
