"""Model-free unit tests: KV pool, request table, sampler, sampling params, detokenizer."""

from __future__ import annotations

import pytest
import torch
from greedy_helpers import assert_same_greedy
from sampling_helpers import filtered_logprobs

from grammarserve.attention.kv_pool import KVPool, ReqToTokenPool
from grammarserve.config import EngineConfig
from grammarserve.engine.request import RequestOutput
from grammarserve.engine.sampler import RowRng, sample
from grammarserve.errors import InvalidRequestError, OutOfMemoryError
from grammarserve.sampling_params import SamplingParams


def _pool(capacity: int = 10) -> KVPool:
    return KVPool(capacity=capacity, num_layers=2, num_kv_heads=2, head_dim=4,
                  dtype=torch.float32)


def test_pool_never_hands_out_padding_slot_and_reuses_freed() -> None:
    pool = _pool(10)
    a = pool.alloc(6)
    b = pool.alloc(4)
    assert 0 not in a.tolist() + b.tolist()
    assert sorted(a.tolist() + b.tolist()) == list(range(1, 11))
    with pytest.raises(OutOfMemoryError, match="0 free slots, 1 requested"):
        pool.alloc(1)
    pool.free(a[:3])
    assert pool.num_free == 3
    assert sorted(pool.alloc(3).tolist()) == sorted(a[:3].tolist())


def test_pool_write_stores_per_layer() -> None:
    pool = _pool(4)
    slots = pool.alloc(2)
    k = torch.randn(2, 2, 4)
    v = torch.randn(2, 2, 4)
    pool.write(1, slots, k, v)
    assert torch.equal(pool.k[1][slots], k) and torch.equal(pool.v[1][slots], v)
    assert pool.k[0].abs().sum() == 0


def test_bytes_per_token() -> None:
    # SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64 -> 46,080 B/token in fp32
    assert KVPool.bytes_per_token(30, 3, 64, torch.float32) == 46080
    assert KVPool.bytes_per_token(30, 3, 64, torch.bfloat16) == 23040


def test_req_to_token_rows() -> None:
    table = ReqToTokenPool(max_reqs=2, max_context=8)
    r0, r1 = table.alloc(), table.alloc()
    assert {r0, r1} == {0, 1}
    with pytest.raises(OutOfMemoryError, match="max_num_reqs"):
        table.alloc()
    table.write(r0, 0, torch.tensor([5, 6, 7]))
    table.write(r0, 3, torch.tensor([9]))
    assert table.slots(r0, 4).tolist() == [5, 6, 7, 9]
    with pytest.raises(OutOfMemoryError, match="context limit"):
        table.write(r0, 6, torch.tensor([1, 2, 3]))
    table.free(r0)
    assert table.slots(r0, 4).tolist() == [0, 0, 0, 0]
    assert table.alloc() == r0


def test_filters_keep_top_k_top_p_min_p() -> None:
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    lp = filtered_logprobs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.isfinite(lp).tolist() == [True, True, False, False, False]
    assert torch.allclose(lp.exp().sum(), torch.tensor(1.0))
    lp = filtered_logprobs(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert torch.isfinite(lp).tolist() == [True, False, False, False, False]  # p(top)=0.64
    lp = filtered_logprobs(logits, SamplingParams(temperature=1.0, top_p=0.7))
    assert torch.isfinite(lp).tolist() == [True, True, False, False, False]
    lp = filtered_logprobs(logits, SamplingParams(temperature=1.0, min_p=0.3))
    assert torch.isfinite(lp).tolist() == [True, True, False, False, False]  # e^-1 > 0.3 > e^-2


def test_sample_seeded_rows_are_independent_of_batch() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 1000)
    p = SamplingParams(temperature=1.0, seed=1)

    alone = [sample(logits[1:2], [p], [RowRng(11)]).token_ids[0] for _ in range(1)]
    batched = sample(logits, [SamplingParams(temperature=0), p, p],
                     [None, RowRng(11), RowRng(12)])
    assert batched.token_ids[1] == alone[0]
    assert batched.token_ids[0] == int(logits[0].argmax())
    assert batched.logprobs[0] == pytest.approx(float(torch.log_softmax(logits[0], -1).max()))


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"max_tokens": 0}, "max_tokens"), ({"temperature": -1.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"), ({"top_k": -1}, "top_k"), ({"min_p": 1.5}, "min_p"),
    ({"top_k": 2**64}, "top_k"),  # fuzzing: it overflowed the sampler's int64 tensor
    ({"stop": [""]}, "stop"),
])
def test_sampling_params_validation(kwargs: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams(**kwargs)  # type: ignore[arg-type]
    assert e.value.param == param


def test_stop_accepts_str_or_list() -> None:
    assert SamplingParams(stop="\n").stop_strings == ("\n",)
    assert SamplingParams(stop=["a", "b"]).stop_strings == ("a", "b")


def test_engine_config_validation() -> None:
    with pytest.raises(InvalidRequestError, match="dtype"):
        EngineConfig(dtype="int8")
    with pytest.raises(InvalidRequestError, match="kv_cache_tokens"):
        EngineConfig(kv_cache_tokens=0)
    assert EngineConfig(dtype="bfloat16").torch_kv_dtype == torch.bfloat16


def test_greedy_comparison_tells_a_near_tie_from_a_difference() -> None:
    def out(ids: list[int], top: list[list[tuple[int, float]]]) -> RequestOutput:
        return RequestOutput("r", [1], ids, "", "", True, "length", top_logprobs=top)

    tie = [(5, -0.69310), (6, -0.69320)]
    far = [(5, -0.1), (6, -2.4)]
    assert_same_greedy(out([1, 5, 9], [far, tie, far]), out([1, 5, 9], [far, tie, far]))
    assert_same_greedy(out([1, 5, 9], [far, tie, far]), out([1, 6, 2], [far, tie[::-1], far]))
    with pytest.raises(AssertionError, match="not a near-tie"):
        assert_same_greedy(out([1, 5], [far, far]), out([1, 6], [far, far]))
    with pytest.raises(AssertionError, match="no top_logprobs"):
        assert_same_greedy(out([1, 5], []), out([1, 6], []))
