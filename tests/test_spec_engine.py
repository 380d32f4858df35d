"""Speculative decoding in the engine, on the embedded model: greedy output is the output of
plain decoding (alone and batched; unconstrained, JSON schema, regex, tool calls), seeded
seeded sampled output too, unseeded sampled output keeps its distribution (chi-square), drafts
are drafted and taken, no KV slot leaks, and a draft that the grammar refuses is never fed to
the model."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from greedy_helpers import assert_same_greedy

from grammarserve.config import EngineConfig
from grammarserve.constraints import Constraint
from grammarserve.engine.engine import Engine
from grammarserve.engine.model_runner import BatchEntry
from grammarserve.engine.spec.ngram import Match
from grammarserve.llm import LLM
from grammarserve.sampling_params import SamplingParams

pytestmark = pytest.mark.model

DOC = ("Invoice INV-2024-0042 from Acme Corp, 12 Main Street, Springfield. Billed to Globex "
       "Ltd. Date 2024-03-15. Items: 3 x Widget A at 12.50, 1 x Gadget B at 99.00. Total 136.50 "
       "USD.")
INVOICE = {"type": "object", "properties": {
    "invoice_number": {"type": "string"}, "seller": {"type": "string"},
    "buyer": {"type": "string"}, "date": {"type": "string"}, "total": {"type": "number"}},
    "required": ["invoice_number", "seller", "buyer", "date", "total"]}
TOOLS = [{"type": "function", "function": {
    "name": "record_invoice", "parameters": {"type": "object", "properties": {
        "number": {"type": "string"}, "seller": {"type": "string"}},
        "required": ["number", "seller"]}}}]
CONSTRAINTS: dict[str, Constraint | None] = {
    "none": None,
    "json_schema": Constraint.json_schema(INVOICE),
    "regex": Constraint.regex(r"INV-[0-9]{4}-[0-9]{4} from [A-Za-z ]{1,30}\."),
    "tools_json_array": Constraint.tool_calls(TOOLS, "required", tool_format="json_array"),
    "tools_hermes": Constraint.tool_calls(TOOLS, "required", tool_format="hermes"),
}


def _chat(llm: LLM, text: str) -> str:
    return str(llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True))


PROMPTS = ("Extract the invoice number, seller, buyer, date and total as JSON.\n\n" + DOC,
           "Repeat this text exactly: " + DOC,
           "Write two sentences about the sea.")


def _engine(smollm: Any, **overrides: Any) -> LLM:
    config = EngineConfig(**{"device": "cpu", "kv_cache_tokens": 8192, "max_num_reqs": 8,
                             **overrides})
    return LLM.from_engine(Engine(config, loaded=smollm))


@pytest.fixture(scope="module")
def plain(smollm: Any) -> LLM:
    return _engine(smollm, num_speculative_tokens=0)


@pytest.fixture(scope="module")
def spec(smollm: Any) -> LLM:
    """Every match drafted in full (not adaptive), so that drafts are verified at every step."""
    return _engine(smollm, num_speculative_tokens=8, speculative_adaptive=False)


def _params(c: Constraint | None, **kw: Any) -> SamplingParams:
    return SamplingParams(max_tokens=kw.pop("max_tokens", 80), temperature=kw.pop("temperature", 0),
                          top_logprobs=kw.pop("top_logprobs", 2), constraint=c, **kw)


def _no_leak(llm: LLM) -> None:
    st = llm.engine.stats()
    assert st.running_requests == 0
    assert st.kv_free + st.kv_cached == st.kv_capacity  # every slot free or in the radix tree


@pytest.mark.parametrize("kind", sorted(CONSTRAINTS))
def test_greedy_alone_is_plain_decoding(plain: LLM, spec: LLM, kind: str) -> None:
    before = spec.engine.spec.counters.accepted_tokens
    for text in PROMPTS[:2]:
        p = _chat(plain, text)
        a = plain.generate([p], _params(CONSTRAINTS[kind]))[0]
        b = spec.generate([p], _params(CONSTRAINTS[kind]))[0]
        assert b.error is None, b.error
        assert_same_greedy(a, b)
        assert b.finish_reason == a.finish_reason
    assert spec.engine.spec.counters.accepted_tokens > before  # drafts were taken
    _no_leak(spec)


def test_greedy_batched_is_plain_decoding(plain: LLM, spec: LLM) -> None:
    prompts = [_chat(plain, t) for t in PROMPTS]
    params = [_params(c) for c in (None, CONSTRAINTS["json_schema"], CONSTRAINTS["regex"])]
    for a, b in zip(plain.generate(prompts * 2, params * 2), spec.generate(prompts * 2, params * 2)):
        assert b.error is None, b.error
        assert_same_greedy(a, b)
    _no_leak(spec)


def test_seeded_sampling_is_plain_decoding(plain: LLM, spec: LLM) -> None:
    """Position j of a draft takes the request's draw j, so a seed gives the same tokens
    (unconstrained: no forced span to meet the draft)."""
    p = _chat(plain, PROMPTS[1])
    for seed in range(3):
        params = _params(None, temperature=0.7, seed=seed, top_logprobs=0, max_tokens=48)
        a, b = plain.generate([p], params)[0], spec.generate([p], params)[0]
        assert a.token_ids == b.token_ids


def test_adaptive_default_is_plain_decoding(plain: LLM, smollm: Any) -> None:
    default = _engine(smollm)  # the shipped defaults
    assert default.engine.config.num_speculative_tokens > 0
    p = _chat(plain, PROMPTS[1])
    for c in (None, CONSTRAINTS["json_schema"]):
        a, b = plain.generate([p], _params(c))[0], default.generate([p], _params(c))[0]
        assert_same_greedy(a, b)
    _no_leak(default)


@pytest.fixture
def fed(spec: LLM) -> Iterator[list[BatchEntry]]:
    """Every batch entry the spec engine's runner is given."""
    runner = spec.engine.runner
    seen: list[BatchEntry] = []
    original = runner.forward

    def forward(entries: list[BatchEntry]) -> Any:
        seen.extend(entries)
        return original(entries)

    runner.forward = forward  # type: ignore[method-assign]
    yield seen
    del runner.forward


def test_refused_draft_never_reaches_the_model(spec: LLM, plain: LLM, fed: list[BatchEntry],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A drafter that proposes tokens the grammar cannot take (letters where the regex wants
    digits): the matcher cuts each draft before them, the reply is plain decoding's."""
    letters = spec.tokenizer.encode("abcabcabc", add_special_tokens=False)
    monkeypatch.setattr(spec.engine.spec, "_match",
                        lambda req, state, seq: Match(2, letters * 4, 0))
    c = Constraint.regex(r"[0-9]{6}")
    p = _chat(plain, "Write six digits.")
    a, b = plain.generate([p], _params(c))[0], spec.generate([p], _params(c))[0]
    assert b.error is None and b.text == a.text
    assert all(t not in letters for e in fed if len(e.token_ids) > 1 for t in e.token_ids)


def test_draft_cut_by_max_tokens(spec: LLM, plain: LLM) -> None:
    p = _chat(plain, PROMPTS[1])
    for n in (1, 2, 5):
        a, b = plain.generate([p], _params(None, max_tokens=n))[0], \
            spec.generate([p], _params(None, max_tokens=n))[0]
        assert len(b.token_ids) == n and b.token_ids == a.token_ids
    _no_leak(spec)


def _chi_square_p(a: Counter[int], b: Counter[int]) -> float:
    """p-value of the chi-square test that two samples share one distribution (categories
    expected fewer than 5 times pooled)."""
    na, nb = sum(a.values()), sum(b.values())
    cats = sorted(set(a) | set(b))
    big = [c for c in cats if (a[c] + b[c]) * min(na, nb) / (na + nb) >= 5]
    rows = [(a[c], b[c]) for c in big]
    rest = (na - sum(x for x, _ in rows), nb - sum(y for _, y in rows))
    if min(rest) > 0:
        rows.append(rest)
    stat = 0.0
    for x, y in rows:
        tot = x + y
        for obs, n in ((x, na), (y, nb)):
            exp = tot * n / (na + nb)
            stat += (obs - exp) ** 2 / exp
    dof = len(rows) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(stat / 2)))


def test_sampled_tokens_keep_their_distribution(plain: LLM, smollm: Any) -> None:
    """The 3rd to 5th sampled tokens (where drafts apply) with and without speculation, 480
    samples each under different seeds, temperature 1: one distribution (chi-square,
    p > 0.001 at each position)."""
    spec = _engine(smollm, num_speculative_tokens=4, speculative_adaptive=False,
                   max_num_reqs=16)
    p = _chat(plain, "Repeat this text exactly: The cat sat on the mat. The cat sat on the mat.")
    n = 480

    def run(llm: LLM, seed0: int) -> list[Counter[int]]:
        outs = llm.generate([p] * n, [SamplingParams(max_tokens=6, temperature=1.0,
                                                     ignore_eos=True, seed=seed0 + i)
                                      for i in range(n)])
        return [Counter(o.token_ids[k] for o in outs) for k in (2, 3, 4)]

    a, b = run(plain, 0), run(spec, 10_000)
    c = spec.engine.spec.counters
    assert c.accepted_tokens >= n // 2, c  # drafts were taken in many samples
    for x, y in zip(a, b):
        assert _chi_square_p(x, y) > 1e-3, (x, y)
