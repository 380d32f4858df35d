"""Engine behaviour on the embedded model: stops, lengths, seeds, chunking, preemption, abort."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from grammarserve.config import EngineConfig
from grammarserve.engine.detokenizer import IncrementalDetokenizer
from grammarserve.engine.engine import Engine
from grammarserve.errors import InvalidRequestError
from grammarserve.llm import LLM
from grammarserve.sampling_params import SamplingParams

pytestmark = pytest.mark.model  # every test here uses the embedded model


GREEDY = SamplingParams(max_tokens=40, temperature=0)


def _chat(llm: LLM, text: str) -> str:
    return str(llm.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                 tokenize=False, add_generation_prompt=True))


@pytest.fixture(scope="module")
def prompts(llm: LLM) -> list[str]:
    return [_chat(llm, q) for q in ("Describe a sunny beach in two sentences.",
                                    "List four animals that live in the ocean.",
                                    "Explain what a compiler does.",
                                    "Write a short greeting for a birthday card.")]


def test_max_tokens_gives_length(llm: LLM, prompts: list[str]) -> None:
    out = llm.generate(prompts[0], SamplingParams(max_tokens=5, temperature=0))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5 and out.finished


def test_eos_gives_stop_without_eos_text(llm: LLM) -> None:
    out = llm.generate(_chat(llm, "Say hi."), SamplingParams(max_tokens=64, temperature=0))[0]
    assert out.finish_reason == "stop"
    assert out.token_ids[-1] in llm.engine.eos_ids
    assert "<|im_end|>" not in out.text


def test_stop_string_truncates(llm: LLM, prompts: list[str]) -> None:
    full = llm.generate(prompts[1], GREEDY)[0].text
    words = full.split()
    assert len(words) > 4
    stop = words[3]
    out = llm.generate(prompts[1], SamplingParams(max_tokens=40, temperature=0, stop=[stop]))[0]
    assert out.finish_reason == "stop"
    assert out.text == full[:full.index(stop)]


def test_seeded_sampling_is_reproducible_and_batch_independent(llm: LLM,
                                                               prompts: list[str]) -> None:
    p = SamplingParams(max_tokens=20, temperature=1.0, seed=1234)
    a = llm.generate(prompts[2], p)[0].token_ids
    b = llm.generate(prompts[2], p)[0].token_ids
    in_batch = llm.generate([prompts[0], prompts[2], prompts[3]],
                            [GREEDY, p, SamplingParams(max_tokens=10, temperature=0.7)])[1]
    other = llm.generate(prompts[2], SamplingParams(max_tokens=20, temperature=1.0, seed=99))
    assert a == b == in_batch.token_ids
    assert other[0].token_ids != a


def test_chunked_prefill_and_preemption_keep_greedy_output(smollm, llm: LLM,  # type: ignore[no-untyped-def]
                                                           prompts: list[str]) -> None:
    reference = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    longest = max(len(llm.tokenizer.encode(p)) for p in prompts)
    # A pool that holds barely more than two sequences forces preemption; a budget of 16
    # tokens per step forces chunked prefill.
    cfg = EngineConfig(device="cpu", kv_cache_tokens=2 * (longest + 40) + 8,
                       max_batch_tokens=16, max_num_reqs=4)
    small = LLM.from_engine(Engine(cfg, loaded=smollm))
    outs = small.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == reference
    st = small.engine.stats()
    assert st.preemptions > 0
    assert st.kv_free + st.kv_cached == cfg.kv_cache_tokens  # nothing leaked


def test_abort_frees_resources(llm: LLM, prompts: list[str]) -> None:
    eng = llm.engine
    aborted_before = eng.stats().aborted_requests
    eng.add_request("to-abort", prompts[0], SamplingParams(max_tokens=100, temperature=0))
    eng.step()
    eng.abort("to-abort")
    eng.abort("to-abort")  # twice: still one abort
    outs = eng.step()
    assert [o.finish_reason for o in outs if o.request_id == "to-abort"] == ["abort"]
    st = eng.stats()  # every KV slot is free or owned by the radix cache: nothing leaked
    assert not eng.has_unfinished() and st.kv_free + st.kv_cached == st.kv_capacity
    eng.abort("to-abort")  # finished: nothing to abort
    assert eng.stats().aborted_requests == aborted_before + 1


def test_bad_prompts_are_refused(llm: LLM) -> None:
    eng = llm.engine
    with pytest.raises(InvalidRequestError, match="empty"):
        eng.add_request("e1", [], GREEDY)
    with pytest.raises(InvalidRequestError, match="token ids"):
        eng.add_request("e2", [1, 10**9], GREEDY)
    with pytest.raises(InvalidRequestError, match="limit"):
        eng.add_request("e3", [5] * 9000, GREEDY)
    assert not eng.has_unfinished()


def test_detokenizer_never_splits_multibyte(llm: LLM) -> None:
    text = "naïve café — 世界 🎉 ok"
    ids = llm.tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(llm.tokenizer)
    pieces = [detok.add([t]) for t in ids] + [detok.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_generate_with_one_bad_prompt_leaves_nothing_queued(llm: LLM) -> None:
    with pytest.raises(InvalidRequestError, match="empty"):
        llm.generate(["Hello there", []], GREEDY)
    assert not llm.engine.has_unfinished()
    assert llm.generate("Hello there", SamplingParams(max_tokens=3, temperature=0))[0].finished


def test_warm_up_builds_the_grammar_backends_before_serving(smollm) -> None:  # type: ignore[no-untyped-def]
    engine = Engine(EngineConfig(model="default", device="cpu"), loaded=smollm)
    policy = engine.grammar.compiler.policy
    assert not policy._backends  # built on first use otherwise
    engine.warm_up()
    assert set(policy._backends) == {"llguidance", "xgrammar"}


def test_a_step_leaves_a_core_to_a_grammar_compiling(smollm,  # type: ignore[no-untyped-def]
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from concurrent.futures import Future

    from grammarserve.constraints import Constraint

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        engine = Engine(EngineConfig(model="default", device="cpu", adaptive_threads=True),
                        loaded=smollm)
        threads: list[int] = []
        forward = engine.runner.forward

        def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
            threads.append(torch.get_num_threads())
            return forward(*args, **kwargs)

        monkeypatch.setattr(engine.runner, "forward", counting)
        engine.add_request("plain", "Hello there", SamplingParams(max_tokens=4, temperature=0))
        engine.step()
        compiling: Future[Any] = Future()  # a compile that has not finished
        monkeypatch.setattr(engine.grammar.compiler, "compile_async",
                            lambda *a, **k: compiling)
        engine.add_request("json", "Hi", SamplingParams(
            max_tokens=4, temperature=0, constraint=Constraint.json_schema({"type": "object"})))
        engine.step()
        assert threads == [2, 1]  # the second step ran beside the compile, on one thread
        engine.abort("json")
        while engine.has_unfinished():
            engine.step()
    finally:
        torch.set_num_threads(before)
