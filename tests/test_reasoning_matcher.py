"""The reasoning span before a constraint (``grammarserve/fsm/reasoning.py``) on the SmolLM2
tokenizer, where ``<think>`` and ``</think>`` are several tokens each: free text, then the
inner constraint from a token boundary; the thinking budget forces the close; strict thinking
bans stop tokens and tool-call markers inside the span."""

from __future__ import annotations

from typing import Any

import pytest
from walk_helpers import allowed_tokens

from grammarserve.constraints import ReasoningSpan
from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.loop_guard import CommaTable, LoopGuardMatcher
from grammarserve.fsm.matcher import Matcher
from grammarserve.fsm.reasoning import ReasoningMatcher, ReasoningTables
from grammarserve.fsm.tools import TRIGGER

pytestmark = pytest.mark.model

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
          "additionalProperties": False}
THINK = ReasoningSpan(end="</think>", open="<think>\n", close="\n</think>", after="\n\n")


@pytest.fixture(scope="module")
def compiler(tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, backend="llguidance")


@pytest.fixture(scope="module")
def tables(compiler: GrammarCompiler, tokenizer: Any) -> ReasoningTables:
    return ReasoningTables(tokenizer, compiler.token_bytes())


def _matcher(compiler: GrammarCompiler, tables: ReasoningTables, span: ReasoningSpan,
             inner: Matcher | None = None) -> ReasoningMatcher:
    return ReasoningMatcher(compiler.vocab, inner, span, tables)


def _json(compiler: GrammarCompiler) -> Matcher:
    return compiler.compile_json_schema(SCHEMA).matcher()


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _take(m: Matcher, ids: list[int]) -> bool:
    return all(m.accept_token(t) for t in ids)


def _mask(m: Matcher, compiler: GrammarCompiler) -> list[int]:
    bitmask = compiler.allocate_bitmask(1)
    m.fill_bitmask(bitmask, 0)
    return allowed_tokens(bitmask)


def _forced_text(m: Matcher, tokenizer: Any) -> str:
    """Take the tokens forced now (one jump-forward span, as the engine does); their text."""
    forced = m.forced_tokens()
    assert _take(m, forced)
    return str(tokenizer.decode(forced))


def test_the_span_is_free_then_the_schema_applies(compiler, tables, tokenizer) -> None:
    m = _matcher(compiler, tables, THINK, _json(compiler))
    assert _forced_text(m, tokenizer) == "<think>\n"
    assert _take(m, _ids(tokenizer, "I think n is 3. {not json} ]]"))
    assert not m.in_answer
    assert _take(m, _ids(tokenizer, "\n</think>"))
    assert m.forcing and _forced_text(m, tokenizer) == "\n\n"
    assert m.in_answer
    answer = _ids(tokenizer, '{"n": 3}')
    assert _take(m, answer) and m.accept_token(tokenizer.eos_token_id) and m.is_terminated()


def test_the_answer_must_match_the_schema(compiler, tables, tokenizer) -> None:
    m = _matcher(compiler, tables, THINK, _json(compiler))
    _forced_text(m, tokenizer)
    assert _take(m, _ids(tokenizer, "ok\n</think>"))
    _forced_text(m, tokenizer)
    assert not _take(m, _ids(tokenizer, "n is 3"))
    assert m.is_error()


def test_no_stop_inside_a_constrained_span(compiler, tables, tokenizer) -> None:
    m = _matcher(compiler, tables, THINK, _json(compiler))
    _forced_text(m, tokenizer)
    assert _take(m, _ids(tokenizer, "hmm"))
    assert tokenizer.eos_token_id not in _mask(m, compiler)
    assert not m.accept_token(tokenizer.eos_token_id)


def test_an_unconstrained_span_may_stop_unless_strict(compiler, tables, tokenizer) -> None:
    free = _matcher(compiler, tables, THINK)
    _forced_text(free, tokenizer)
    assert tokenizer.eos_token_id in _mask(free, compiler)
    strict = _matcher(compiler, tables, ReasoningSpan(**{**THINK.__dict__, "strict": True,
                                                         "banned": (TRIGGER,)}))
    _forced_text(strict, tokenizer)
    assert tokenizer.eos_token_id not in _mask(strict, compiler)


def test_strict_thinking_bans_the_tool_call_trigger(compiler, tables, tokenizer) -> None:
    span = ReasoningSpan(**{**THINK.__dict__, "strict": True, "banned": (TRIGGER,)})
    m = _matcher(compiler, tables, span)
    _forced_text(m, tokenizer)
    ids = _ids(tokenizer, "call it: " + TRIGGER)
    assert _take(m, ids[:-1])
    assert ids[-1] not in _mask(m, compiler)
    assert not m.accept_token(ids[-1])
    loose = _matcher(compiler, tables, THINK)
    _forced_text(loose, tokenizer)
    assert _take(loose, ids)


def test_a_token_past_the_end_marker_is_masked(compiler, tables, tokenizer) -> None:
    """``>`` alone may close ``</think``; a token holding ``>`` and more may not (the answer
    starts on a token boundary)."""
    m = _matcher(compiler, tables, THINK, _json(compiler))
    _forced_text(m, tokenizer)
    assert _take(m, _ids(tokenizer, "ok </think"))
    allowed = set(_mask(m, compiler))
    past = [t for t, b in enumerate(tables.token_bytes) if b.startswith(b">") and len(b) > 1]
    assert past and not allowed & set(past)
    closer = _ids(tokenizer, ">")
    assert len(closer) == 1 and closer[0] in allowed


def test_the_budget_forces_the_close(compiler, tables, tokenizer) -> None:
    span = ReasoningSpan(**{**THINK.__dict__, "budget": 5})
    m = _matcher(compiler, tables, span, _json(compiler))
    _forced_text(m, tokenizer)
    words = _ids(tokenizer, " one two three four five six seven")
    assert _take(m, words[:5])
    assert m.forcing and m.span_tokens == 5
    assert _mask(m, compiler) == [m.forced_tokens()[0]]
    assert not m.accept_token(words[5])  # NOTE: a 6th span token is refused
    m2 = _matcher(compiler, tables, span, _json(compiler))
    _forced_text(m2, tokenizer)
    _take(m2, words[:5])
    assert _forced_text(m2, tokenizer) == "\n</think>\n\n"
    assert m2.in_answer and _take(m2, _ids(tokenizer, '{"n": 1}'))


def test_a_zero_budget_writes_an_empty_span(compiler, tables, tokenizer) -> None:
    m = _matcher(compiler, tables, ReasoningSpan(**{**THINK.__dict__, "budget": 0}),
                 _json(compiler))
    assert _forced_text(m, tokenizer) == "<think>\n\n</think>\n\n"
    assert m.in_answer


def test_an_open_prompt_starts_inside_the_span(compiler, tables, tokenizer) -> None:
    m = _matcher(compiler, tables, ReasoningSpan(end="</think>", after="\n\n"),
                 compiler.compile_regex("[a-z]+").matcher())
    assert m.forced_tokens() == []
    assert _take(m, _ids(tokenizer, "thinking...</think>"))
    assert _forced_text(m, tokenizer) == "\n\n"
    assert _take(m, _ids(tokenizer, "yes"))


def test_rollback_crosses_back_into_the_span(compiler, tables, tokenizer) -> None:
    m = _matcher(compiler, tables, THINK, _json(compiler))
    _forced_text(m, tokenizer)
    _take(m, _ids(tokenizer, "a</think>"))
    _forced_text(m, tokenizer)
    head = _ids(tokenizer, '{"n"')
    _take(m, head)
    after = len(_ids(tokenizer, "\n\n"))
    m.rollback(len(head) + after + 1)  # NOTE: the answer, what was forced, and ">"
    assert not m.in_answer and not m.is_error()
    assert _take(m, _ids(tokenizer, ">"))
    _forced_text(m, tokenizer)
    assert _take(m, _ids(tokenizer, '{"n": 2}'))


def test_the_loop_guard_sees_only_the_answer(compiler, tables, tokenizer) -> None:
    """A wrapper that tracks JSON from the start of its output works behind the span: the
    reasoning text (with brackets and quotes) never reaches it."""
    schema = {"type": "object", "properties": {"xs": {"type": "array", "items": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}},
        "required": ["xs"]}
    inner = compiler.compile_json_schema(schema).matcher()
    guard = LoopGuardMatcher(inner.vocab, inner, CommaTable(compiler.token_bytes()), 1)
    m = _matcher(compiler, tables, THINK, guard)
    _forced_text(m, tokenizer)
    _take(m, _ids(tokenizer, 'say [{"a": 1}, {"a": 1}] "\n</think>'))
    _forced_text(m, tokenizer)
    taken = 0
    for t in _ids(tokenizer, '{"xs": [{"a": 1}, {"a": 1}'):
        assert m.accept_token(t)
        taken += m.take_retraction()
    assert taken > 0  # NOTE: the copy was taken back inside the answer
    assert m.in_answer and not m.is_error()
    # NOTE: the guard took back the copy and the "}" before it: the model ends the item
    assert _take(m, _ids(tokenizer, "}]}")) and m.accept_token(tokenizer.eos_token_id)
