"""Paged decode attention (K/V read in place through the request-to-token table): the torch
reference against plain SDPA per request, and the Triton kernel against the reference (in the
Triton interpreter on a CPU-only machine, compiled on CUDA)."""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn.functional as F
from grammarserve_kernels.paged_decode import paged_decode_attention, paged_decode_ref

ON_GPU = torch.cuda.is_available()
if not ON_GPU and "triton" not in sys.modules:
    # NOTE: as in test_kernels_triton.py: the interpreter is chosen when triton is first imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _case(seed: int, lens: list[int], heads: int, kv_heads: int, d: int,
          dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    slots = sum(lens) + 5
    k = torch.randn(slots, kv_heads, d, generator=g).to(dtype)
    v = torch.randn(slots, kv_heads, d, generator=g).to(dtype)
    table = torch.zeros(len(lens) + 2, max(lens) + 3, dtype=torch.int64)
    perm = torch.randperm(slots - 1, generator=g) + 1
    rows = torch.randperm(len(lens) + 2, generator=g)[:len(lens)]
    off = 0
    for r, n in zip(rows.tolist(), lens):
        table[r, :n] = perm[off:off + n]
        off += n
    q = torch.randn(len(lens), heads, d, generator=g).to(dtype)
    return q, k, v, table, rows, torch.tensor(lens)


def _sdpa(q, k, v, table, rows, lens, scale):  # type: ignore[no-untyped-def]
    out = []
    for i, (r, n) in enumerate(zip(rows.tolist(), lens.tolist())):
        s = table[r, :n]
        kk = k[s].float().transpose(0, 1)  # [Hkv, n, d]
        vv = v[s].float().transpose(0, 1)
        group = q.shape[1] // k.shape[1]
        o = F.scaled_dot_product_attention(
            q[i].float()[:, None], kk.repeat_interleave(group, 0),
            vv.repeat_interleave(group, 0), scale=scale)
        out.append(o[:, 0])
    return torch.stack(out).to(q.dtype)


@pytest.mark.parametrize(("lens", "heads", "kv_heads"), [([1], 2, 2), ([5, 70, 1, 129], 8, 2),
                                                         ([33, 64], 9, 3)])
def test_reference_matches_sdpa(lens: list[int], heads: int, kv_heads: int) -> None:
    args = _case(0, lens, heads, kv_heads, 32)
    torch.testing.assert_close(paged_decode_ref(*args, 32**-0.5), _sdpa(*args, 32**-0.5),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("lens", "heads", "kv_heads", "dtype"), [
    ([3], 4, 4, torch.float32), ([5, 70, 1, 129], 8, 2, torch.float32),
    ([33, 64, 65], 9, 3, torch.float32), ([40, 7], 8, 2, torch.bfloat16)])
def test_triton_matches_reference(lens: list[int], heads: int, kv_heads: int,
                                  dtype: torch.dtype) -> None:
    triton = pytest.importorskip("triton")
    if not ON_GPU and not triton.knobs.runtime.interpret:
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set: run this file alone")
    args = _case(1, lens, heads, kv_heads, 64, dtype)
    dev = "cuda" if ON_GPU else "cpu"
    got = paged_decode_attention(*(a.to(dev) for a in args), 0.125, backend="triton")
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.cpu().float(), paged_decode_ref(*args, 0.125).float(),
                               rtol=tol, atol=tol)


def test_bad_shapes_are_refused() -> None:
    q, k, v, table, rows, lens = _case(2, [4, 4], 6, 4, 16)
    with pytest.raises(ValueError, match="multiple"):
        paged_decode_attention(q, k, v, table, rows, lens, 0.25)
