"""The varlen attention backend (the CUDA default) against the torch SDPA backend on ragged
batches, on CPU: its index tensors, GQA, the sliding window and the padded reference path. On CUDA
the same inputs go through FlashAttention (checked by benchmarks/gpu_smoke.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import ATOL, build_tiny, hf_logits, prompt_ids, tiny_tokenizer

from grammarserve.attention.backend import TorchSDPABackend
from grammarserve.attention.forward_batch import ForwardBatch
from grammarserve.attention.kv_pool import KVPool, ReqToTokenPool
from grammarserve.attention.staging import stage_int64
from grammarserve.attention.varlen import VarlenBackend, flash_usable
from grammarserve.config import EngineConfig
from grammarserve.engine.engine import Engine
from grammarserve.engine.model_runner import BatchEntry, ModelRunner
from grammarserve.models.loader import load_model
from grammarserve.sampling_params import SamplingParams

# (table row, cached prefix, new tokens): a fresh prefill, a long extend over a prefix, a
# jump-forward span, two decode tokens.
RAGGED = [(2, 0, 20), (0, 6, 30), (3, 10, 5), (1, 12, 1), (4, 40, 1)]
DECODE = [(2, 3, 1), (0, 30, 1), (1, 12, 1), (4, 1, 1)]  # (the GQA-swapped decode path)


def _pool_and_batch(heads: int, kv_heads: int, d: int, seed: int,
                    layout: list[tuple[int, int, int]] = RAGGED,
                    ) -> tuple[KVPool, ReqToTokenPool, ForwardBatch, torch.Tensor]:
    """A pool whose cached prefixes hold random K/V (slots in random order), and a batch of
    the layout's new tokens; returns also random q/k/v of the new tokens."""
    g = torch.Generator().manual_seed(seed)
    total = sum(p + n for _, p, n in layout)
    pool = KVPool(capacity=total + 8, num_layers=1, num_kv_heads=kv_heads, head_dim=d,
                  dtype=torch.float32)
    table = ReqToTokenPool(max_reqs=6, max_context=64)
    slots = pool.alloc(total)[torch.randperm(total, generator=g)]
    off = 0
    for row, p, n in layout:
        table.write(row, 0, slots[off:off + p + n])
        pool.k[0][slots[off:off + p]] = torch.randn(p, kv_heads, d, generator=g)
        pool.v[0][slots[off:off + p]] = torch.randn(p, kv_heads, d, generator=g)
        off += p + n
    ext = [n for _, _, n in layout]
    owners = [row for row, _, n in layout for _ in range(n)]
    pos = [q for _, p, n in layout for q in range(p, p + n)]
    t = len(pos)
    batch = ForwardBatch(
        input_ids=torch.zeros(t, dtype=torch.int64), positions=torch.tensor(pos),
        out_cache_loc=table.table[torch.tensor(owners), torch.tensor(pos)],
        req_pool_indices=[r for r, _, _ in layout], prefix_lens=[p for _, p, _ in layout],
        extend_lens=ext, logit_rows=torch.tensor(ext).cumsum(0) - 1,
        seq_ids=list(range(len(layout))))
    qkv = torch.randn(t, heads + 2 * kv_heads, d, generator=g)
    return pool, table, batch, qkv


@pytest.mark.parametrize(("heads", "kv_heads", "window", "layout"), [
    (4, 4, None, RAGGED), (6, 2, None, RAGGED), (4, 1, 7, RAGGED), (6, 2, None, DECODE),
    (9, 3, None, DECODE), (4, 2, 5, DECODE)])
def test_varlen_matches_torch_backend(heads: int, kv_heads: int, window: int | None,
                                      layout: list[tuple[int, int, int]]) -> None:
    d = 16
    outs = []
    for make in (lambda p, t: TorchSDPABackend(p, t, window, mirror_tokens=0),
                 lambda p, t: VarlenBackend(p, t, window)):
        pool, table, batch, qkv = _pool_and_batch(heads, kv_heads, d, seed=1, layout=layout)
        attn = make(pool, table)
        attn.prepare(batch)
        q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
        outs.append(attn.forward(0, q, k, v))
        written = pool.k[0][batch.out_cache_loc]
        assert torch.equal(written, k), "new K must be stored at out_cache_loc"
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)


def test_flash_is_only_for_cuda_half_precision() -> None:
    assert not flash_usable(torch.zeros(2, 4, 64))
    assert not flash_usable(torch.zeros(2, 4, 64, dtype=torch.bfloat16))  # CPU tensor


def test_stage_int64_keeps_each_list() -> None:
    a, b, c = stage_int64([[3, 1], [], [7, 8, 9]], torch.device("cpu"))
    assert (a.tolist(), b.tolist(), c.tolist()) == ([3, 1], [], [7, 8, 9])
    assert a.dtype == torch.int64


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("varlen") / "model"
    return folder, build_tiny("llama", {}, folder, tiny_tokenizer())


def test_model_on_varlen_backend_matches_transformers(tiny_folder: tuple[Path, Any]) -> None:
    """A ragged batch (prefill, extend over a prefix, decode) through the tiny Llama."""
    folder, ref = tiny_folder
    lm = load_model(str(folder))
    mc = lm.config
    pool = KVPool(capacity=200, num_layers=mc.num_layers, num_kv_heads=mc.num_kv_heads,
                  head_dim=mc.head_dim, dtype=torch.float32)
    table = ReqToTokenPool(max_reqs=4, max_context=128)
    runner = ModelRunner(lm.model, pool, table, VarlenBackend(pool, table))
    reqs = [(2, 0, 20), (0, 6, 24), (1, 12, 13)]
    seqs = [prompt_ids(n, seed=30 + i) for i, (_, _, n) in enumerate(reqs)]
    for row, _, n in reqs:
        table.write(row, 0, pool.alloc(n))
    runner.forward([BatchEntry(row, 0, seq[:p]) for (row, p, _), seq in zip(reqs, seqs) if p])
    batch = runner.build_batch([BatchEntry(row, p, seq[p:]) for (row, p, _), seq in
                                zip(reqs, seqs)])
    batch.logit_rows = torch.arange(sum(n - p for _, p, n in reqs))
    got = runner.model(batch, runner.attn)
    start = 0
    for (_, p, n), seq in zip(reqs, seqs):
        want = hf_logits(ref, seq)[p:]
        assert (got[start:start + n - p] - want).abs().max().item() < ATOL
        start += n - p


def test_engine_greedy_same_on_both_backends(tiny_folder: tuple[Path, Any]) -> None:
    folder, _ = tiny_folder
    prompts = [prompt_ids(n, seed=50 + n) for n in (9, 17, 4)]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    got = {}
    for backend in ("torch", "varlen"):
        engine = Engine(EngineConfig(model=str(folder), device="cpu", kv_cache_tokens=512,
                                     max_num_reqs=4, attention_backend=backend))
        assert isinstance(engine.runner.attn, VarlenBackend) == (backend == "varlen")
        for i, p in enumerate(prompts):
            engine.add_request(str(i), p, params)
        done: dict[str, list[int]] = {}
        while engine.has_unfinished():
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out.token_ids
        got[backend] = done
    assert got["torch"] == got["varlen"] and len(got["torch"]["0"]) == 12
