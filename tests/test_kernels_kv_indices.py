"""The KV-index builder (request-to-token table -> flat slot list of a ragged batch): the Triton
kernel against the torch reference, and the reference against a plain loop. On a CPU-only machine
the kernel runs in the Triton interpreter; with a GPU it runs compiled, on CUDA tensors."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from grammarserve_kernels.kv_indices import kv_indices, kv_indices_ref

ON_GPU = torch.cuda.is_available()
if not ON_GPU and "triton" not in sys.modules:
    # NOTE: as in test_kernels_triton.py: the interpreter is chosen when triton is first imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _case(seed: int, b: int, max_context: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    g = torch.Generator().manual_seed(seed)
    table = torch.randint(1, 10_000, (b + 3, max_context), generator=g)
    rows = torch.randperm(b + 3, generator=g)[:b]
    lens = torch.randint(1, max_context + 1, (b,), generator=g).tolist()
    lens[0] = max_context  # one full row (several kernel blocks when max_context > 512)
    return table, rows, lens


def _loop(table: torch.Tensor, rows: torch.Tensor, lens: list[int]) -> torch.Tensor:
    return torch.cat([table[int(r), :n] for r, n in zip(rows, lens)])


def _cu(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int64)


@pytest.mark.parametrize(("seed", "b", "max_context"), [(0, 1, 7), (1, 5, 40), (2, 9, 1300)])
def test_reference_matches_loop(seed: int, b: int, max_context: int) -> None:
    table, rows, lens = _case(seed, b, max_context)
    got = kv_indices_ref(table, rows, _cu(lens), sum(lens))
    assert torch.equal(got, _loop(table, rows, lens))


@pytest.mark.parametrize(("seed", "b", "max_context"), [(3, 1, 3), (4, 6, 50), (5, 4, 1100)])
def test_triton_matches_reference(seed: int, b: int, max_context: int) -> None:
    triton = pytest.importorskip("triton")
    if not ON_GPU and not triton.knobs.runtime.interpret:
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set: run this file alone")
    table, rows, lens = _case(seed, b, max_context)
    cu = _cu(lens)
    dev = "cuda" if ON_GPU else "cpu"
    got = kv_indices(table.to(dev), rows.to(dev), cu.to(dev), sum(lens), backend="triton")
    assert torch.equal(got.cpu(), kv_indices_ref(table, rows, cu, sum(lens)))


def test_bad_shapes_are_refused() -> None:
    table, rows, lens = _case(6, 3, 10)
    with pytest.raises(ValueError, match="cu_k"):
        kv_indices(table, rows, _cu(lens)[:-1], sum(lens))
    with pytest.raises(ValueError, match="backend"):
        kv_indices(table, rows, _cu(lens), sum(lens), backend="cuda")
