"""OpenAI sampling controls on the CPU path: frequency / presence / repetition penalties, logit
bias and top logprobs in the torch reference kernel, the engine's sampler and the engine (a
tiny random-weight model), each against a plain-torch reference of the definitions."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from bitmask_helpers import pack_bitmask
from controls_helpers import CONTROLS, check_against_reference, make_case, reference_logprobs
from grammarserve_kernels import build_controls, sample_tokens, stream_keys

from grammarserve.constraints import Constraint
from grammarserve.engine.sampler import History, RowRng, sample
from grammarserve.errors import InvalidRequestError
from grammarserve.llm import LLM
from grammarserve.sampling_params import SamplingParams


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("control", CONTROLS)
def test_reference_kernel_applies_each_control(control: str, masked: bool) -> None:
    case = make_case(control, masked=masked, seed=CONTROLS.index(control))
    out = sample_tokens(case.logits, case.bitmask, case.temperature, case.keys,
                        controls=case.controls(), num_top=case.num_top)
    check_against_reference(case, *out)
    assert out.top_ids.shape == (6, 20)


def test_controls_change_the_greedy_choice_and_leave_other_rows_alone() -> None:
    case = make_case("all", masked=False)
    plain = sample_tokens(case.logits, None, case.temperature, case.keys)
    got = sample_tokens(case.logits, None, case.temperature, case.keys,
                        controls=case.controls())
    for i in (0, 3, 5):  # greedy rows with controls: their best token is banned and penalized
        assert got.ids[i] != plain.ids[i]
    for i in (1, 4):  # no controls: bit-for-bit the same draw
        assert got.ids[i] == plain.ids[i] and got.logprobs[i] == plain.logprobs[i]


def test_a_bias_never_re_allows_a_masked_token() -> None:
    g = torch.Generator().manual_seed(3)
    b, v = 64, 300
    logits = torch.randn(1, v, generator=g).expand(b, v)
    allowed = torch.zeros(b, v, dtype=torch.bool)
    allowed[:, [3, 150, 299]] = True
    up = dict.fromkeys(range(v), 100.0) | {3: -100.0, 150: -100.0, 299: -100.0}
    controls = build_controls(b, v, torch.device("cpu"), rows=list(range(b)),
                              generated=[[]] * b, prompts=[None] * b, bias=[up] * b,
                              frequency=[0.0] * b, presence=[0.0] * b, repetition=[1.0] * b)
    temperature = torch.tensor([0.0, 2.0] * (b // 2))
    out = sample_tokens(logits, pack_bitmask(allowed), temperature,
                        stream_keys(range(b), [0] * b), controls=controls,
                        num_top=torch.full((b,), 20))
    assert set(out.ids.tolist()) <= {3, 150, 299}
    assert set(out.top_ids[:, :3].flatten().tolist()) == {3, 150, 299}
    assert bool((out.top_ids[:, 3:] == -1).all()), "top lists hold allowed tokens only"


def test_top_logprobs_match_the_chosen_tokens_distribution() -> None:
    case = make_case("frequency", masked=True, seed=9)
    out = sample_tokens(case.logits, case.bitmask, case.temperature, case.keys,
                        controls=case.controls(), num_top=torch.full((6,), 20))
    ref = reference_logprobs(case)
    for i in range(6):
        row = dict(zip(out.top_ids[i].tolist(), out.top_logprobs[i].tolist()))
        tok = int(out.ids[i])
        if tok in row:  # the chosen token, when listed, has the same logprob in both places
            assert row[tok] == pytest.approx(float(out.logprobs[i]), abs=1e-5)
        assert sum(torch.tensor(list(row.values())).exp()) <= 1.0 + 1e-5
        assert float(ref[i].exp().sum()) == pytest.approx(1.0, abs=1e-4)


def test_sampler_counts_generated_tokens_and_prompt_tokens() -> None:
    """Penalties read each row's History: frequency / presence over the generated part,
    repetition over prompt + generated."""
    logits = torch.zeros(3, 40)
    logits[:, 7], logits[:, 8], logits[:, 9] = 5.0, 4.0, 3.5
    hist = [History([7, 1, 8, 7, 7], 2), History([7, 1, 8], 3), History([9, 2, 8], 1)]
    params = [SamplingParams(temperature=0, frequency_penalty=0.8),  # 7: 3.4, 8: 3.2, 9: 3.5
              SamplingParams(temperature=0, frequency_penalty=2.0),  # nothing generated
              SamplingParams(temperature=0, repetition_penalty=2.0, top_logprobs=3)]
    out = sample(logits, params, [None] * 3, history=hist)
    assert out.token_ids == [9, 7, 7]
    assert out.top[0] == [] and [t for t, _ in out.top[2]] == [7, 8, 9]
    x = logits[2].clone()
    x[[8, 9]] /= 2.0  # seen: 9 in the prompt, 2 and 8 generated (2's logit 0 stays 0)
    want = torch.log_softmax(x, dim=0)[[7, 8, 9]]
    assert [lp for _, lp in out.top[2]] == pytest.approx(want.tolist(), abs=1e-5)
    with pytest.raises(ValueError, match="History"):
        sample(logits, params, [None] * 3)


def test_sampler_filtered_rows_list_top_logprobs_of_the_filtered_distribution() -> None:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 500, generator=g)
    params = [SamplingParams(temperature=0.8, top_k=3, top_logprobs=5, logit_bias={0: 30.0}),
              SamplingParams(temperature=0, top_logprobs=2, presence_penalty=2.0)]
    hist = [History([1, 2], 1), History([int(logits[1].argmax())], 0)]
    out = sample(logits, params, [RowRng(1), None], history=hist)
    assert len(out.top[0]) == 3 and out.top[0][0][0] == 0  # top-k 3 leaves 3, the biased first
    assert out.token_ids[0] in [t for t, _ in out.top[0]]
    assert sum(torch.tensor([lp for _, lp in out.top[0]]).exp()) == pytest.approx(1.0, abs=1e-5)
    assert out.token_ids[1] != int(logits[1].argmax()) and len(out.top[1]) == 2


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"presence_penalty": -3}, "presence_penalty"),
    ({"presence_penalty": float("nan")}, "presence_penalty"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"repetition_penalty": float("inf")}, "repetition_penalty"),
    ({"repetition_penalty": 1e-30}, "repetition_penalty"),  # would overflow a logit
    ({"logit_bias": {5: 101.0}}, "logit_bias"),
    ({"logit_bias": {-1: 1.0}}, "logit_bias"),
    ({"logit_bias": {"5": 1.0}}, "logit_bias"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": True}, "top_logprobs"),
])
def test_sampling_params_refuse_out_of_range_controls(kwargs: dict[str, object],
                                                      param: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams(**kwargs)  # type: ignore[arg-type]
    assert e.value.param == param


# -- the engine, on a tiny random-weight model (byte tokenizer: token id == byte) --------------
@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    from tiny_models import build_tiny, tiny_tokenizer

    from grammarserve.config import EngineConfig
    from grammarserve.engine.engine import Engine

    folder: Path = tmp_path_factory.mktemp("tiny") / "model"
    build_tiny("llama", {}, folder, tiny_tokenizer())
    return LLM.from_engine(Engine(EngineConfig(model=str(folder), device="cpu",
                                               kv_cache_tokens=1024, max_num_reqs=4)))


@pytest.mark.parametrize("jump_forward", [True, False])
def test_forced_tokens_count_as_generated(tiny_llm: LLM, jump_forward: bool) -> None:
    """``aaa(a|b)``: the first ``a`` is sampled, the next two are forced (jump-forward) or
    sampled; either way the penalties see three ``a`` when choosing the last letter."""
    ids = {"a": 97, "b": 98}

    def last_choice(freq: float = 0.0, pres: float = 0.0) -> dict[int, float]:
        p = SamplingParams(max_tokens=8, temperature=0, constraint=Constraint.regex("aaa(a|b)"),
                           top_logprobs=5, jump_forward=jump_forward, frequency_penalty=freq,
                           presence_penalty=pres)
        out = tiny_llm.generate([[104, 105, 32]], p)[0]
        assert out.token_ids[:3] == [97] * 3 and len(out.top_logprobs) == len(out.token_ids)
        assert out.top_logprobs[1] == [(97, 0.0)]  # forced or not: the only allowed token
        return dict(out.top_logprobs[3])  # only the two allowed letters are listed

    plain = last_choice()
    pen = last_choice(freq=0.5, pres=0.25)
    assert sorted(plain) == sorted(pen) == [97, 98]
    shift = (pen[ids["b"]] - pen[ids["a"]]) - (plain[ids["b"]] - plain[ids["a"]])
    assert shift == pytest.approx(3 * 0.5 + 0.25, abs=1e-4)


def test_engine_refuses_a_bias_outside_the_vocabulary(tiny_llm: LLM) -> None:
    with pytest.raises(InvalidRequestError) as e:
        tiny_llm.generate([[104]], SamplingParams(logit_bias={256: 1.0}))
    assert e.value.param == "logit_bias"
