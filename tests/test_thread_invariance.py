"""The engine's results do not depend on the CPU thread count, which ThreadTuner changes from
step to step: greedy tokens and their log-probabilities are bitwise equal on one and two threads
(prefill chunks on the torch path, decode steps in the one-call C++ stack, the int8 matmuls and
the fused attention all split work without splitting any one sum)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.model


def test_one_and_two_threads_give_the_same_tokens_and_logprobs(smollm) -> None:  # type: ignore[no-untyped-def]
    from grammarserve import SamplingParams
    from grammarserve.config import EngineConfig
    from grammarserve.engine.engine import Engine
    from grammarserve.llm import LLM

    config = EngineConfig(device="cpu", kv_cache_tokens=8192, max_num_reqs=8,
                          enable_prefix_cache=False, adaptive_threads=False)
    llm = LLM.from_engine(Engine(config, loaded=smollm))
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(100, 40000, (n,), generator=gen).tolist() for n in (5, 60, 300, 700)]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs = llm.generate(prompts, params)
            runs.append([(o.token_ids, o.logprobs) for o in outs])
    finally:
        torch.set_num_threads(before)
    assert all(len(ids) == 16 and len(lps) == 16 for ids, lps in runs[0])
    assert runs[0] == runs[1]
