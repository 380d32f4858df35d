"""The CUDA-graph decode path's static forward, run eagerly on CPU: padded buckets, K/V read in
place through the table (paged decode attention), padding rows that touch nothing but slot 0.
(The capture itself needs CUDA: benchmarks/gpu_smoke.py runs it.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import build_tiny, prompt_ids, tiny_tokenizer

from grammarserve.attention.kv_pool import KVPool, ReqToTokenPool
from grammarserve.attention.paged_decode import PagedDecodeBackend
from grammarserve.attention.varlen import VarlenBackend
from grammarserve.engine.cuda_graphs import DecodeGraphs
from grammarserve.engine.model_runner import BatchEntry, ModelRunner
from grammarserve.models.loader import load_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("graphs") / "model"
    build_tiny("llama", {}, folder, tiny_tokenizer())
    return load_model(str(folder))


def _runners(lm: Any) -> tuple[ModelRunner, ModelRunner]:
    """Two runners over identical pools: eager varlen, and varlen + the static decode path."""
    out = []
    for graphs in (False, True):
        mc = lm.config
        pool = KVPool(capacity=300, num_layers=mc.num_layers, num_kv_heads=mc.num_kv_heads,
                      head_dim=mc.head_dim, dtype=torch.float32)
        table = ReqToTokenPool(max_reqs=6, max_context=100)
        g = DecodeGraphs(lm.model, pool, table, max_batch=6) if graphs else None
        out.append(ModelRunner(lm.model, pool, table, VarlenBackend(pool, table), g))
    return out[0], out[1]


@pytest.mark.parametrize("n", [1, 3, 5])
def test_static_decode_matches_eager(tiny: Any, n: int) -> None:
    eager, static = _runners(tiny)
    assert static.graphs is not None and not static.graphs.capture  # CPU: never captured
    lens = [7, 30, 12, 1, 50][:n]
    seqs = [prompt_ids(m + 4, seed=60 + i) for i, m in enumerate(lens)]
    perm = torch.randperm(299, generator=torch.Generator().manual_seed(n)) + 1
    for runner in (eager, static):
        off = 0
        for row, m in enumerate(lens):
            runner.req_to_token.write(row, 0, perm[off:off + m + 4])
            off += m + 4
        runner.forward([BatchEntry(row, 0, seqs[row][:m]) for row, m in enumerate(lens)])
    for step in range(4):
        entries = [BatchEntry(row, m + step, [seqs[row][m + step]]) for row, m in
                   enumerate(lens)]
        assert static.graphs.usable(entries) and static.graphs.bucket(n) >= n
        want, got = eager.forward(entries), static.forward(entries)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for layer in range(len(eager.pool.k)):  # the same K/V everywhere but the padding slot
        # (to rounding: layer 0's attention differs in the last bits between the two kernels)
        torch.testing.assert_close(static.pool.k[layer][1:], eager.pool.k[layer][1:],
                                   rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(static.pool.v[layer][1:], eager.pool.v[layer][1:],
                                   rtol=1e-4, atol=1e-4)


def test_buckets_and_what_takes_the_path(tiny: Any) -> None:
    _, static = _runners(tiny)
    g = static.graphs
    assert g is not None and g.buckets == [1, 2, 4, 8] and g.max_batch == 8
    assert [g.bucket(n) for n in (1, 3, 5, 8)] == [1, 4, 8, 8]
    assert not g.usable([BatchEntry(0, 4, [1, 2])])  # a jump-forward span: eager
    assert not g.usable([BatchEntry(0, 4, [1])] * 9)
    assert DecodeGraphs.supports(tiny.model)


def test_paged_backend_refuses_extends(tiny: Any) -> None:
    eager, _ = _runners(tiny)
    eager.req_to_token.write(0, 0, eager.pool.alloc(5))
    batch = eager.build_batch([BatchEntry(0, 0, [1, 2, 3])])
    with pytest.raises(ValueError, match="decode batches only"):
        PagedDecodeBackend(eager.pool, eager.req_to_token).prepare(batch)


def test_engine_resolution_keeps_graphs_off_on_cpu(tmp_path: Path) -> None:
    from grammarserve.config import EngineConfig

    assert EngineConfig(device="cuda").resolved().cuda_graphs
    assert not EngineConfig(device="cpu").resolved().cuda_graphs
