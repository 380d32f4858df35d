"""Speculative decoding's parts: the n-gram and reply indexes, the step-cost fit and the draft
length it gives, the matcher's draft acceptance (value checks and the loop guard refuse what
they would take back, leaving the matcher exactly as it was), and, on a tiny random-weight
model (byte tokenizer, no download), greedy equality with value-check retries."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grammarserve.config import EngineConfig
from grammarserve.constraints import Constraint
from grammarserve.engine.engine import Engine
from grammarserve.engine.spec.calibrate import calibrate
from grammarserve.engine.spec.cost import SpecSwitch, StepCost, draft_length
from grammarserve.engine.spec.ngram import NgramIndex, space_folded
from grammarserve.engine.spec.replies import ReplyIndex, ReplyStore
from grammarserve.llm import LLM
from grammarserve.sampling_params import SamplingParams


def test_ngram_index_finds_the_latest_longest_match() -> None:
    seq = [1, 2, 3, 9, 1, 2, 3, 7, 5, 2, 3]
    index = NgramIndex()
    index.update(seq)
    m = index.match(seq)
    assert m is not None and m.n == 2 and list(m.source[m.start:m.start + 2]) == [7, 5]
    seq += [7]  # now "2 3 7" occurred before (at 5..7): the longer match wins
    index.update(seq)
    m = index.match(seq)
    assert m is not None and m.n == 3 and m.source[m.start] == 5
    assert index.match([4, 4]) is None


def test_ngram_index_after_tokens_were_taken_back() -> None:
    index = NgramIndex()
    index.update([1, 2, 3, 4, 1, 2])
    index.update([1, 2])  # shorter: indexed again from scratch, no stale continuation
    assert index.match([1, 2]) is None


def test_ngram_index_keeps_an_id_the_fold_does_not_cover() -> None:
    # a forced token outside the vocabulary fails its request at the batch entry check; the
    # index must not fail first (an IndexError there failed every request's step)
    index = NgramIndex(fold=[0, 0, 2])
    seq = [1, 9, 2, 1, 9]
    index.update(seq)
    m = index.match(seq)
    assert m is not None and m.n == 2 and m.source[m.start] == 2


def test_space_folded_ids() -> None:
    vocab = {"Kofi": 0, "\u0120Kofi": 1, "\u0120Smith": 2, "\u2581is": 3, "is": 4, "\u0120": 5}
    assert space_folded(vocab, 7) == [0, 0, 2, 4, 4, 5, 6]  # no space-less twin: kept


def test_ngram_index_matches_a_value_copied_without_its_leading_space() -> None:
    # the document's " Kofi Smith is 35", and a JSON value that starts after its quote:
    # "Kofi" (space-less) then " Smith"; folded, the two-gram matches the document's
    fold = [0, 0, 2, 3, 4, 5, 6]  # 1 = " Kofi" folds to 0 = "Kofi"
    doc = [5, 1, 2, 3, 4]
    reply = doc + [6, 0, 2]
    plain, folded = NgramIndex(), NgramIndex(fold)
    plain.update(reply)
    folded.update(reply)
    assert plain.match(reply) is None
    m = folded.match(reply)
    assert m is not None and m.n == 2 and list(m.source[m.start:m.start + 2]) == [3, 4]


def test_switch_recovers_from_one_unlucky_first_draft_step() -> None:
    switch = SpecSwitch()
    switch.record(1, True, 0.010, 1)  # a draft of nothing but misses: 10 ms per token
    for _ in range(10):
        switch.record(1, False, 0.006, 1)  # plain steps: 6 ms per token
    for _ in range(6):
        switch.record(1, True, 0.003, 1)  # then drafts that pay: 3 ms per token
    assert switch.enabled(1)  # 4.0 ms on the plain mean (6.7 ms with a 0.1 smoothing from the first)


def test_calibration_fits_the_span_cost_and_frees_its_row(tiny_folder: Path) -> None:
    engine = _tiny(tiny_folder, 4).engine
    runner = engine.runner
    free = (runner.pool.num_free, runner.req_to_token.num_free)
    cost = StepCost()
    calibrate(runner, cost, seq_id=10**6)
    assert (runner.pool.num_free, runner.req_to_token.num_free) == free
    fit = cost.fit()
    assert fit is not None and fit.step(1, 0.1) > 0 and fit.marginal(128) >= 0


def test_reply_index_bounded_and_drafts_from_earlier_replies() -> None:
    replies = ReplyIndex(max_tokens=10)
    replies.add([1, 2, 3, 4, 5])
    m = replies.match([9, 2, 3])
    assert m is not None and list(m.source[m.start:]) == [4, 5]
    replies.add([6, 7, 8, 9, 10, 11])  # 11 tokens in all: the first reply goes
    assert replies.match([9, 2, 3]) is None
    assert replies.match([7, 8]) is not None
    store = ReplyStore(max_namespaces=1, tokens_each=100)
    store.add("a", [1, 2, 3])
    store.add("b", [1, 2, 3])
    assert store.get("a") is None and store.get("b") is not None  # namespaces never mix


def test_step_cost_fit_and_draft_length() -> None:
    cost = StepCost()
    for tokens, context in [(1, 100), (2, 3000), (4, 500), (8, 3000), (1, 5000), (3, 50)] * 30:
        attention = tokens * (context + tokens / 2) / 1000
        cost.observe(tokens, attention, 0.010 + 0.002 * tokens + 0.0005 * attention)
    fit = cost.fit()
    assert fit is not None
    assert fit.a == pytest.approx(0.010, rel=0.05) and fit.b == pytest.approx(0.002, rel=0.05)
    assert fit.c == pytest.approx(0.0005, rel=0.05)
    assert fit.marginal(4000) == pytest.approx(0.004, rel=0.05)
    # one row, a token saves ~12 ms and costs 2 ms: worth drafting while alpha^i > 1/6
    assert draft_length(0.8, 0.012, 0.002, 8) == 8
    assert draft_length(0.5, 0.012, 0.002, 8) == 2
    assert draft_length(0.1, 0.012, 0.002, 8) == 0
    # 32 rows: a token saves 0.5 ms; no draft pays
    assert draft_length(0.8, 0.0005, 0.002, 8) == 0


def test_step_cost_prior_before_the_sizes_vary() -> None:
    cost = StepCost()
    for _ in range(50):
        cost.observe(1, 0.5, 0.008)  # every step one token: the prior's slope stays
    fit = cost.fit()
    assert fit is not None and fit.b > 0 and fit.c > 0
    assert fit.step(1, 0.5) == pytest.approx(0.008, rel=0.05)


PAIR = {"type": "array", "items": {"type": "string", "pattern": "^[ab]$"}, "minItems": 2,
        "maxItems": 2, "uniqueItems": True}


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_models import build_tiny, tiny_tokenizer

    folder: Path = tmp_path_factory.mktemp("tiny") / "model"
    build_tiny("llama", {}, folder, tiny_tokenizer())
    return folder


def _tiny(folder: Path, k: int) -> LLM:
    return LLM.from_engine(Engine(EngineConfig(
        model=str(folder), device="cpu", kv_cache_tokens=4096, max_num_reqs=16,
        grammar_check_retries=5, num_speculative_tokens=k, speculative_adaptive=False)))


def test_accept_draft_refuses_a_failing_value_and_leaves_the_matcher(tiny_folder: Path) -> None:
    llm = _tiny(tiny_folder, 4)
    runner = llm.engine.grammar
    compiled = runner.compiler.compile_json_schema(PAIR)
    m = compiled.matcher()
    for t in b'["a", ':
        assert m.accept_token(t)
    assert m.accept_draft(ord('"')) and m.accept_draft(ord("a"))
    assert not m.accept_draft(ord('"'))  # closes a copy of "a": refused, nothing retried
    assert not m.is_error() and m.take_retraction() == 0
    m.rollback(2)
    fresh = compiled.matcher()
    for t in b'["a", ':
        fresh.accept_token(t)
    bitmask = runner.compiler.allocate_bitmask(2)
    m.fill_bitmask(bitmask, 0)
    fresh.fill_bitmask(bitmask, 1)
    assert torch.equal(bitmask[0], bitmask[1])  # exactly the state before the draft


def test_greedy_with_value_check_retries_is_plain_decoding(tiny_folder: Path) -> None:
    plain, spec = _tiny(tiny_folder, 0), _tiny(tiny_folder, 6)
    prompts = [list(b'["a", "b"] ["a", "b"] ["b", "a"] '), list(b"abcabcabcabc")]
    params = SamplingParams(max_tokens=60, temperature=0, constraint=Constraint.json_schema(PAIR))
    a = plain.generate(prompts, params)
    b = spec.generate(prompts, params)
    for x, y in zip(a, b):
        assert (x.token_ids, x.finish_reason, x.error) == (y.token_ids, y.finish_reason, y.error)
    assert plain.engine.stats().check_retries == spec.engine.stats().check_retries
    assert spec.engine.spec.counters.drafted_tokens > 0


SAME = {"type": "object", "properties": {"items": {"type": "array", "items": {
    "type": "object", "properties": {"a": {"const": "x"}}, "required": ["a"],
    "additionalProperties": False}}}, "required": ["items"], "additionalProperties": False}


def test_a_draft_check_leaves_the_loop_guard_as_it_was(tiny_folder: Path) -> None:
    """A draft that would close a copied item is cut before the closing token; afterwards the
    matcher's masks, and what the real copy then does (the guard takes it back), are those of
    a matcher that never saw the draft."""
    llm = LLM.from_engine(Engine(EngineConfig(
        model=str(tiny_folder), device="cpu", kv_cache_tokens=2048, max_num_reqs=2,
        grammar_json_style="compact", loop_guard=2, num_speculative_tokens=12)))
    runner = llm.engine.grammar
    prefix = list(b'{"items":[{"a":"x"},{"a":"x"},')
    copy = list(b'{"a":"x"}')

    def matcher_after(tokens: list[int]) -> object:
        from grammarserve.engine.request import Req

        req = Req("r", [1], SamplingParams(constraint=Constraint.json_schema(SAME)), None,
                  arrival=0)  # type: ignore[arg-type]
        runner.start_compile(req)
        assert req.grammar_future is not None
        req.grammar_future.result()
        runner.finish_compile(req)
        for t in tokens:
            assert req.matcher is not None and req.matcher.accept_token(t)
        return req

    drafted, fresh = matcher_after(prefix), matcher_after(prefix)
    drafted.draft = list(copy)  # type: ignore[attr-defined]
    runner.check_draft(drafted, 0)  # type: ignore[arg-type]
    assert drafted.draft == copy[:-1]  # type: ignore[attr-defined]  # cut before the "}"
    bitmask = runner.compiler.allocate_bitmask(2)
    for t in copy:
        for row, r in enumerate((drafted, fresh)):
            r.matcher.fill_bitmask(bitmask, row)  # type: ignore[attr-defined]
        assert torch.equal(bitmask[0], bitmask[1])
        backs = [(r.matcher.accept_token(t), r.matcher.take_retraction())  # type: ignore[attr-defined]
                 for r in (drafted, fresh)]
        assert backs[0] == backs[1]
    assert backs[0][1] > 0  # the real copy was taken back, the same way
