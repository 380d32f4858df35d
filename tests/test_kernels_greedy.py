"""Greedy rows: the torch fast path and the CPU kernel (``greedy_cpu.cpp``) against the general
sampling path: the same tokens (first index on ties), log-probabilities within float rounding,
empty masks reported, thread counts without effect."""

from __future__ import annotations

import pytest
import torch
from grammarserve_kernels.greedy import greedy_kernel, greedy_tokens_cpu
from grammarserve_kernels.sample import sample_tokens
from grammarserve_kernels.sample_ref import greedy_tokens_ref, sample_tokens_ref


def _case(b: int, v: int, masked: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, v, generator=g) * 4
    if b > 1:
        logits[1, v // 3] = logits[1, v // 2] = logits[1].max() + 1  # a tie: the first wins
    if not masked:
        return logits, None
    bitmask = torch.randint(-2**31, 2**31 - 1, (b, (v + 31) // 32), dtype=torch.int32,
                            generator=g)
    bitmask[0, :] = -1
    if b > 2:
        bitmask[2] = 0  # nothing allowed
    return logits, bitmask


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("b,v", [(1, 49152), (4, 1001), (3, 7), (8, 4096)])
def test_fast_paths_equal_the_general_path(b: int, v: int, masked: bool) -> None:
    logits, bitmask = _case(b, v, masked, seed=b * v)
    temps, keys = torch.zeros(b), torch.zeros(b, 2, dtype=torch.int64)
    general = sample_tokens_ref(logits, bitmask, temps, keys,
                                num_top=torch.zeros(b, dtype=torch.int64))  # not the fast path
    ref = greedy_tokens_ref(logits, bitmask)
    auto = sample_tokens(logits, bitmask, temps, keys)  # the kernel where it builds
    for got in (ref, auto):
        assert got.ids.tolist() == general.ids.tolist()
        assert torch.allclose(got.logprobs, general.logprobs, atol=2e-5)  # -inf where empty
        assert got.top_ids.shape == got.top_logprobs.shape == (b, 0)
    if masked and b > 2:
        assert auto.ids[2] == -1 and auto.logprobs[2] == float("-inf")
    assert logits.isfinite().all()  # the caller's logits are not masked in place


def test_kernel_reads_strided_rows_and_ignores_the_thread_count() -> None:
    lib = greedy_kernel()
    if lib is None:
        pytest.skip("no AVX2 here")
    wide, bitmask = _case(16, 5000, True, seed=7)
    logits = wide[:, :4999]  # rows 5000 floats apart, V not a multiple of 8
    bitmask = bitmask[:, : (4999 + 31) // 32].contiguous()
    ref = greedy_tokens_ref(logits.contiguous(), bitmask)
    before = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            runs.append(greedy_tokens_cpu(logits, bitmask, lib))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    assert runs[0][0].tolist() == ref.ids.tolist()
    assert torch.allclose(runs[0][1], ref.logprobs, atol=2e-5)


def test_kernel_refuses_what_it_cannot_read() -> None:
    lib = greedy_kernel()
    if lib is None:
        pytest.skip("no AVX2 here")
    with pytest.raises(ValueError, match="fp32 on CPU with contiguous rows"):
        greedy_tokens_cpu(torch.zeros(2, 8, dtype=torch.float16), None, lib)


def test_engine_sampler_greedy_fast_path_equals_the_general_path() -> None:
    from grammarserve.engine.sampler import sample
    from grammarserve.sampling_params import SamplingParams

    logits, bitmask = _case(5, 3000, True, seed=11)
    fast = sample(logits, [SamplingParams(temperature=0)] * 5, [None] * 5, bitmask)
    general = sample(logits, [SamplingParams(temperature=0, top_logprobs=1)] * 5, [None] * 5,
                     bitmask)  # top log-probabilities: the general path
    assert fast.token_ids == general.token_ids and fast.no_allowed == general.no_allowed
    assert fast.no_allowed[2] and fast.token_ids[2] == 0
    assert torch.allclose(torch.tensor(fast.logprobs), torch.tensor(general.logprobs), atol=2e-5)
    assert fast.top == [[]] * 5
