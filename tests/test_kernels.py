"""The torch path of the fused mask + sample kernel (the CPU path): distribution, masking,
reproducibility, filters, dispatch."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from bitmask_helpers import pack_bitmask as _pack
from grammarserve_kernels import filter_logits, masked_scaled_logits, sample_tokens, stream_keys
from grammarserve_kernels.sample_ref import SAMPLE_BLOCK, disallowed_mask


def _draw(logits: torch.Tensor, allowed: torch.Tensor | None, temperature: float, n: int,
          seed: int, *, chunk: int = 10_000) -> torch.Tensor:
    """``n`` independent draws from one row, ``chunk`` rows (streams) per kernel call."""
    out = []
    for start in range(0, n, chunk):
        rows = min(chunk, n - start)
        bitmask = None if allowed is None else _pack(allowed[None]).expand(rows, -1)
        keys = stream_keys([seed] * rows, range(start, start + rows))
        ids = sample_tokens(logits[None].expand(rows, -1), bitmask,
                            torch.full((rows,), temperature), keys).ids
        out.append(ids)
    return torch.cat(out)


def _chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    stat = ((counts - expected) ** 2 / expected).sum()
    dof = torch.tensor(float(counts.numel() - 1))
    return float(torch.special.gammaincc(dof / 2, stat / 2))


def test_masked_sampling_matches_renormalized_softmax() -> None:
    g = torch.Generator().manual_seed(0)
    v = SAMPLE_BLOCK + 76  # two blocks, the second one partial
    logits = torch.randn(v, generator=g) * 1.5
    allowed = torch.zeros(v, dtype=torch.bool)
    allowed[torch.randperm(v, generator=g)[:40]] = True
    allowed[[0, SAMPLE_BLOCK - 1, SAMPLE_BLOCK, v - 1]] = True  # block edges
    ids = _draw(logits, allowed, 0.7, 100_000, seed=1)

    assert bool(allowed[ids].all()), "a masked token was sampled"
    probs = torch.softmax(logits[allowed] / 0.7, dim=-1).double()
    counts = torch.bincount(ids, minlength=v)[allowed].double()
    assert _chi_square_pvalue(counts, probs) > 1e-3


def test_unconstrained_sampling_matches_softmax_over_blocks() -> None:
    g = torch.Generator().manual_seed(2)
    v = 2 * SAMPLE_BLOCK + 7
    logits = torch.full((v,), -30.0)
    hot = torch.tensor([3, 500, 1023, 1024, 2047, 2048, v - 1])  # mass in every block
    logits[hot] = torch.randn(hot.numel(), generator=g)
    ids = _draw(logits, None, 1.0, 20_000, seed=3)
    assert bool(torch.isin(ids, hot).all())
    probs = torch.softmax(logits[hot], dim=-1).double()
    assert _chi_square_pvalue(torch.bincount(ids, minlength=v)[hot].double(), probs) > 1e-3


def test_same_seed_same_tokens_different_seed_different_stream() -> None:
    logits = torch.zeros(200, 4000)  # flat: every draw is pure noise
    temperature = torch.ones(200)
    first = sample_tokens(logits, None, temperature, stream_keys([7] * 200, range(200)))[0]
    again = sample_tokens(logits, None, temperature, stream_keys([7] * 200, range(200)))[0]
    other = sample_tokens(logits, None, temperature, stream_keys([8] * 200, range(200)))[0]
    assert torch.equal(first, again)
    assert (first != other).float().mean() > 0.99
    assert first.unique().numel() > 190  # the offsets of one seed are different draws too


def test_logprobs_and_greedy() -> None:
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(4, 1500, generator=g)
    allowed = torch.rand(4, 1500, generator=g) < 0.3
    temperature = torch.tensor([0.0, 0.5, 1.0, 0.0])
    keys = stream_keys(range(4), [0] * 4)
    ids, logprobs, *_ = sample_tokens(logits, _pack(allowed), temperature, keys)
    masked = logits.masked_fill(~allowed, float("-inf"))
    scale = torch.where(temperature == 0, 1.0, temperature)[:, None]
    expected = torch.log_softmax(masked / scale, dim=-1).gather(1, ids[:, None])[:, 0]
    torch.testing.assert_close(logprobs, expected, rtol=1e-5, atol=1e-5)
    assert ids[[0, 3]].tolist() == masked[[0, 3]].argmax(dim=-1).tolist()
    assert bool(allowed[torch.arange(4), ids].all())


def test_row_with_nothing_allowed_is_reported() -> None:
    logits = torch.randn(3, 100)
    allowed = torch.ones(3, 100, dtype=torch.bool)
    allowed[1] = False
    for t in (0.0, 1.0):
        ids, logprobs, *_ = sample_tokens(logits, _pack(allowed), torch.full((3,), t),
                                      stream_keys(range(3), [0] * 3))
        assert ids[1] == -1 and logprobs[1] == float("-inf")
        assert bool((ids[[0, 2]] >= 0).all()) and bool(torch.isfinite(logprobs[[0, 2]]).all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits(dtype: torch.dtype) -> None:
    logits = torch.randn(5, 777).to(dtype)
    keys = stream_keys(range(5), [0] * 5)
    temperature = torch.tensor([0.0, 1.0, 0.3, 2.0, 0.0])
    got = sample_tokens(logits, None, temperature, keys)
    want = sample_tokens(logits.float(), None, temperature, keys)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


def test_cpu_masking_matches_bit_unpacking() -> None:
    g = torch.Generator().manual_seed(5)
    v = 1000
    bitmask = torch.randint(-2**31, 2**31 - 1, (6, (v + 31) // 32), dtype=torch.int32,
                            generator=g)
    logits = torch.randn(6, v, generator=g)
    fast = masked_scaled_logits(logits, bitmask, torch.ones(6))  # xgrammar's CPU loop
    words = bitmask.long() & 0xFFFFFFFF
    bits = (words[:, :, None] >> torch.arange(32)) & 1
    disallowed = bits.reshape(6, -1)[:, :v] == 0
    assert torch.equal(disallowed_mask(bitmask, v), disallowed)
    assert torch.equal(fast, logits.masked_fill(disallowed, float("-inf")))


def test_filters() -> None:
    y = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]] * 4)
    top_k = torch.tensor([2, 0, 0, 3])
    top_p = torch.tensor([1.0, 0.7, 1.0, 0.5])
    min_p = torch.tensor([0.0, 0.0, 0.3, 0.0])
    kept = torch.isfinite(filter_logits(y, top_k, top_p, min_p)).tolist()
    assert kept == [[True, True, False, False, False], [True, True, False, False, False],
                    [True, True, False, False, False], [True, False, False, False, False]]


def test_bad_inputs_say_how_to_fix() -> None:
    logits = torch.randn(2, 100)
    keys = stream_keys(range(2), [0] * 2)
    with pytest.raises(ValueError, match=r"ceil\(V/32\)"):
        sample_tokens(logits, torch.zeros(2, 3, dtype=torch.int32), torch.ones(2), keys)
    with pytest.raises(ValueError, match="temperature"):
        sample_tokens(logits, None, torch.ones(3), keys)
    with pytest.raises(ValueError, match="logits"):
        sample_tokens(logits.long(), None, torch.ones(2), keys)


def test_cpu_path_does_not_import_triton() -> None:
    script = (
        "import sys, torch\n"
        "from grammarserve.engine.sampler import make_rng, sample\n"
        "from grammarserve.sampling_params import SamplingParams as P\n"
        "out = sample(torch.randn(2, 50), [P(temperature=0.5, top_p=0.9), P()],\n"
        "             [make_rng(1), make_rng(2)], torch.full((2, 2), -1, dtype=torch.int32))\n"
        "assert 'triton' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
