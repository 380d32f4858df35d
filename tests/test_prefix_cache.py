"""Radix-cached engine on the embedded model: shared prefixes, cached-token accounting, eviction
and preemption under a small pool, namespaces, stop strings across token boundaries."""

from __future__ import annotations

import pytest
from greedy_helpers import assert_same_greedy

from grammarserve.config import EngineConfig
from grammarserve.engine.engine import Engine
from grammarserve.engine.request import RequestOutput
from grammarserve.llm import LLM
from grammarserve.sampling_params import SamplingParams

pytestmark = pytest.mark.model  # every test here uses the embedded model


PREAMBLE = ("You are an extraction assistant. Read the document and answer briefly with the "
            "requested facts. Be precise and do not invent anything. ") * 3
QUESTIONS = ["Who wrote it?", "When was it written?", "Where does it happen?", "What is it about?",
             "How long is it?", "Which language is it in?", "Is it fiction?", "Name one person.",
             "What year?", "Summarise it.", "Give a title.", "What is the tone?", "Who is it for?",
             "Count the people.", "What happens first?", "What happens last?"]


def _prompts(llm: LLM) -> list[str]:
    return [str(llm.tokenizer.apply_chat_template(
        [{"role": "system", "content": PREAMBLE}, {"role": "user", "content": q * (1 + i % 3)}],
        tokenize=False, add_generation_prompt=True)) for i, q in enumerate(QUESTIONS)]


def _engine(smollm, **kw) -> LLM:  # type: ignore[no-untyped-def]
    cfg = EngineConfig(device="cpu", **{"kv_cache_tokens": 8192, "max_num_reqs": 16, **kw})
    return LLM.from_engine(Engine(cfg, loaded=smollm))


# Greedy, with the two best tokens of each step (to tell a fp32 near-tie from a real difference).
GREEDY = SamplingParams(max_tokens=12, temperature=0, top_logprobs=2)


@pytest.fixture(scope="module")
def alone(smollm) -> list[RequestOutput]:  # type: ignore[no-untyped-def]
    """Reference: each prompt alone, no prefix cache."""
    llm = _engine(smollm, enable_prefix_cache=False)
    return [llm.generate(p, GREEDY)[0] for p in _prompts(llm)]


def _assert_equal_alone(outs: list[RequestOutput], alone: list[RequestOutput]) -> None:
    assert len(outs) == len(alone)
    for out, ref in zip(outs, alone):
        assert_same_greedy(out, ref)  # up to fp32 near-ties


def test_concurrent_shared_prefix_equals_alone(smollm, alone) -> None:  # type: ignore[no-untyped-def]
    llm = _engine(smollm)
    outs = llm.generate(_prompts(llm), GREEDY)
    _assert_equal_alone(outs, alone)
    st = llm.engine.stats()
    # the shared preamble was prefilled once and reused by the 15 others
    assert st.cached_prompt_tokens > 0.5 * st.prompt_tokens
    assert st.kv_free + st.kv_cached == st.kv_capacity  # nothing leaked


def test_second_identical_request_is_cached(smollm) -> None:  # type: ignore[no-untyped-def]
    llm = _engine(smollm)
    prompt = _prompts(llm)[0]
    params = SamplingParams(max_tokens=12, temperature=0)
    first = llm.generate(prompt, params)[0]
    second = llm.generate(prompt, params)[0]
    assert second.token_ids == first.token_ids
    assert second.num_cached_tokens >= 0.9 * len(second.prompt_token_ids)
    assert first.num_cached_tokens == 0


def test_small_pool_evicts_and_preempts_with_same_output(smollm, alone) -> None:  # type: ignore[no-untyped-def]
    llm = _engine(smollm)
    longest = max(len(llm.tokenizer.encode(p)) for p in _prompts(llm))
    llm = _engine(smollm, kv_cache_tokens=3 * (longest + 12), max_batch_tokens=64)
    outs = llm.generate(_prompts(llm), GREEDY)
    _assert_equal_alone(outs, alone)
    assert all(o.finished for o in outs)
    st = llm.engine.stats()
    assert st.preemptions > 0 or st.evicted_tokens > 0
    assert st.kv_free + st.kv_cached == st.kv_capacity


@pytest.mark.parametrize("cache", [False, True])
def test_abort_returns_pool_to_initial_free_count(smollm, cache: bool) -> None:  # type: ignore[no-untyped-def]
    llm = _engine(smollm, enable_prefix_cache=cache)
    eng = llm.engine
    initial = eng.runner.pool.num_free
    for i, p in enumerate(_prompts(llm)[:6]):
        eng.add_request(f"a{i}", p, SamplingParams(max_tokens=50, temperature=0))
    for _ in range(4):
        eng.step()
    for i in range(6):
        eng.abort(f"a{i}")
    outs = eng.step()
    assert sorted(o.finish_reason or "" for o in outs) == ["abort"] * 6
    assert not eng.has_unfinished()
    if eng.cache is not None:  # aborted requests leave their computed prefix in the cache
        assert eng.cache.locked_tokens == 0
        eng.cache.reset()
    assert eng.runner.pool.num_free == initial


def test_namespaces_do_not_share_kv(smollm) -> None:  # type: ignore[no-untyped-def]
    llm = _engine(smollm)
    prompt = _prompts(llm)[0]
    params = SamplingParams(max_tokens=4, temperature=0)
    eng = llm.engine
    eng.add_request("ns-a", prompt, params, namespace="tenant-a")
    while eng.has_unfinished():
        eng.step()
    eng.add_request("ns-b", prompt, params, namespace="tenant-b")
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    assert outs[-1].num_cached_tokens == 0
    eng.add_request("ns-a2", prompt, params, namespace="tenant-a")
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    assert outs[-1].num_cached_tokens > 0


def test_stop_string_spanning_tokens(smollm) -> None:  # type: ignore[no-untyped-def]
    llm = _engine(smollm)
    prompt = _prompts(llm)[9]
    full = llm.generate(prompt, SamplingParams(max_tokens=30, temperature=0))[0]
    tok = llm.tokenizer
    pieces = [tok.decode(full.token_ids[:i]) for i in range(len(full.token_ids) + 1)]
    # a stop string made of the end of one token's text and the start of the next
    for i in range(2, len(full.token_ids) - 1):
        a, b = pieces[i - 1], pieces[i]
        c = pieces[i + 1]
        if len(b) - len(a) >= 2 and len(c) - len(b) >= 2:
            stop = b[-2:] + c[len(b):len(b) + 2]
            break
    else:
        pytest.skip("no suitable token boundary")
    out = llm.generate(prompt, SamplingParams(max_tokens=30, temperature=0, stop=stop))[0]
    assert out.finish_reason == "stop"
    assert out.text == full.text[:full.text.index(stop)]
    assert stop not in out.text
