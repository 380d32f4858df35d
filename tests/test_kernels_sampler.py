"""The engine's sampler on top of the fused kernel: random streams, filters, empty masks."""

from __future__ import annotations

import pytest
import torch
from bitmask_helpers import unpack_bitmask
from sampling_helpers import filtered_logprobs

from grammarserve.engine.sampler import RowRng, sample
from grammarserve.sampling_params import SamplingParams


def _allow_all(b: int, v: int) -> torch.Tensor:
    return torch.full((b, (v + 31) // 32), -1, dtype=torch.int32)


def test_offsets_advance_once_per_sampled_row_and_empty_rows_are_reported() -> None:
    logits = torch.randn(4, 300)
    bitmask = _allow_all(4, 300)
    bitmask[3] = 0
    rngs = [None, RowRng(1), RowRng(2, offset=5), RowRng(3)]
    params = [SamplingParams(temperature=0), SamplingParams(),
              SamplingParams(top_k=5, top_p=0.9), SamplingParams()]
    out = sample(logits, params, rngs, bitmask)
    assert [r.offset for r in rngs[1:]] == [1, 6, 1]  # type: ignore[union-attr]
    assert out.no_allowed == [False, False, False, True]
    assert out.token_ids[3] == 0 and out.logprobs[3] == float("-inf")
    assert out.token_ids[0] == int(logits[0].argmax())
    assert out.token_ids[2] in torch.topk(logits[2], 5).indices.tolist()


def test_filtered_rows_report_logprob_under_the_filtered_distribution() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 500, generator=g)
    bitmask = _allow_all(3, 500)
    bitmask[:, 3:] = 0  # only tokens 0..95 allowed
    params = [SamplingParams(temperature=0.8, top_p=0.8), SamplingParams(temperature=1.2),
              SamplingParams(temperature=0.5, top_k=10, min_p=0.05)]
    out = sample(logits, params, [RowRng(i) for i in range(3)], bitmask)
    allowed = unpack_bitmask(bitmask, 500)
    for i, p in enumerate(params):
        lp = filtered_logprobs(logits[i].masked_fill(~allowed[i], float("-inf")), p)
        tok = out.token_ids[i]
        assert tok < 96 and torch.isfinite(lp[tok])
        assert out.logprobs[i] == pytest.approx(float(lp[tok]), abs=1e-5)


def test_a_requests_stream_is_reproducible_and_independent_of_the_batch() -> None:
    g = torch.Generator().manual_seed(1)
    steps = [torch.randn(3, 1000, generator=g) for _ in range(10)]
    p = SamplingParams(temperature=1.0, top_p=0.95)

    def run(seed: int, row: int) -> list[int]:
        rngs: list[RowRng | None] = [RowRng(99), RowRng(seed), RowRng(98)]
        return [sample(x, [p] * 3, rngs).token_ids[row] for x in steps]

    stream: list[RowRng | None] = [RowRng(7)]
    alone = [sample(x[1:2], [p], stream).token_ids[0] for x in steps]
    assert run(7, 1) == run(7, 1) == alone
    assert run(7, 1) != run(8, 1)


def test_a_sampled_row_without_a_stream_is_refused() -> None:
    with pytest.raises(ValueError, match="make_rng"):
        sample(torch.randn(1, 10), [SamplingParams()], [None])

