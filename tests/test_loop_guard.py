"""The array loop guard (``grammarserve/fsm/loop_guard.py``) on the SmolLM2 tokenizer and real
grammars: a copied object item is taken back and the array closes in the model's own tokens;
items that differ, scalar items and schemas whose array may not end there are left alone."""

from __future__ import annotations

import json
from typing import Any

import pytest
from walk_helpers import allowed_tokens

from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.loop_guard import CommaTable, LoopGuardMatcher
from grammarserve.fsm.matcher import Matcher

ITEM = {"type": "object", "properties": {"a": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["a"]}
SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "items": ITEM}},
          "required": ["items"]}

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def compiler(tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, backend="llguidance", json_style="flexible")


@pytest.fixture(scope="module")
def table(compiler: GrammarCompiler) -> CommaTable:
    return CommaTable(compiler.token_bytes())


def _guard(compiler: GrammarCompiler, table: CommaTable, schema: dict[str, Any],
           repeats: int) -> LoopGuardMatcher:
    inner = compiler.compile_json_schema(schema).matcher()
    return LoopGuardMatcher(inner.vocab, inner, table, repeats)


def _feed(m: Matcher, tokenizer: Any, text: str) -> tuple[list[int], int]:
    """Accept ``text``'s tokens one by one until the matcher takes some back; the tokens it
    holds then, and how many it took back (0: none)."""
    kept: list[int] = []
    for t in tokenizer.encode(text, add_special_tokens=False):
        assert m.accept_token(t), (text, tokenizer.decode(kept))
        kept.append(t)
        back = m.take_retraction()
        if back:
            return kept[:len(kept) - back], back
    return kept, 0


def _text(tokenizer: Any, ids: list[int]) -> str:
    return str(tokenizer.decode(ids))


def _close(m: Matcher, tokenizer: Any, text: str, head: str) -> Any:
    """End the kept item as ``text`` did, then the array and the document; the value."""
    end = text.index("}", len(head)) + 1
    rest = text[len(head):end] + "]}"
    for t in tokenizer.encode(rest, add_special_tokens=False) + [tokenizer.eos_token_id]:
        assert m.accept_token(t), (head, rest, m.error())
    assert m.is_terminated()
    return json.loads(head + rest)


def _allowed_text(m: Matcher, compiler: GrammarCompiler, tokenizer: Any) -> set[str]:
    bitmask = compiler.allocate_bitmask(1)
    m.fill_bitmask(bitmask, 0)
    return {tokenizer.decode([t]) for t in allowed_tokens(bitmask)}


@pytest.mark.parametrize("style", ["spaced", "compact", "indented"])
def test_second_copy_is_taken_back_and_the_array_closes(compiler: GrammarCompiler,
                                                        table: CommaTable, tokenizer: Any,
                                                        style: str) -> None:
    item = {"a": "Duct tape, 2 in", "n": 4}
    doc = {"items": [item, item, item]}
    text = {"spaced": json.dumps(doc), "compact": json.dumps(doc, separators=(",", ":")),
            "indented": json.dumps(doc, indent=2)}[style]
    m = _guard(compiler, table, SCHEMA, repeats=1)
    kept, back = _feed(m, tokenizer, text)
    assert back > 0 and m.guarded == 1
    assert m.take_guard_cuts() == 1 and m.take_guard_cuts() == 0
    head = _text(tokenizer, kept)  # the first item, without the token that closed it
    assert head.count('"a"') == 1, head
    allowed = _allowed_text(m, compiler, tokenizer)
    assert not any("," in t for t in allowed), sorted(t for t in allowed if "," in t)[:10]
    assert any(t.strip() == "}" for t in allowed)
    # the model ends the item and the array in its own tokens; the reply is the first item
    assert _close(m, tokenizer, text, head) == {"items": [item]}


def test_two_copies_with_repeats_two(compiler: GrammarCompiler, table: CommaTable,
                                     tokenizer: Any) -> None:
    a, b = {"a": "x"}, {"a": "y"}
    text = json.dumps({"items": [a, b, a, b, a]})
    m = _guard(compiler, table, SCHEMA, repeats=2)
    kept, back = _feed(m, tokenizer, text)
    assert back > 0
    assert _close(m, tokenizer, text, _text(tokenizer, kept)) == {"items": [a, b, a]}


def test_streams_hold_back_what_the_guard_may_take(compiler: GrammarCompiler,
                                                   table: CommaTable, tokenizer: Any) -> None:
    m = _guard(compiler, table, SCHEMA, repeats=1)
    kept, back = _feed(m, tokenizer, '{"items": [{"a": "x"}, {"a": "x"')
    assert back == 0
    held = m.held_from()
    assert held is not None
    # from the token that closed the first item (the guard goes back to it)
    assert "}" not in _text(tokenizer, kept[:held]) and "}" in _text(tokenizer, [kept[held]])


@pytest.mark.parametrize("text", [
    json.dumps({"items": [{"a": "x", "n": 1}, {"a": "x", "n": 2}, {"a": "x", "n": 3}]}),
    json.dumps({"items": [{"a": "x"}, {"a": "y"}, {"a": "z"}]}),
])
def test_items_that_differ_are_left_alone(compiler: GrammarCompiler, table: CommaTable,
                                          tokenizer: Any, text: str) -> None:
    m = _guard(compiler, table, SCHEMA, repeats=1)
    _, back = _feed(m, tokenizer, text)
    assert back == 0 and m.guarded == 0
    assert m.held_from() is None


def test_scalar_items_are_left_alone(compiler: GrammarCompiler, table: CommaTable,
                                     tokenizer: Any) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "array", "items": {
        "type": "integer"}}}, "required": ["n"]}
    m = _guard(compiler, table, schema, repeats=1)
    _, back = _feed(m, tokenizer, '{"n": [1, 1, 1, 1, 2]}')
    assert back == 0
    assert m.accept_token(tokenizer.eos_token_id) and m.is_terminated()


def test_an_array_that_may_not_end_goes_on(compiler: GrammarCompiler, table: CommaTable,
                                           tokenizer: Any) -> None:
    """minItems not met: with every comma banned the array's level allows only whitespace, up
    to the grammar's bound, and then nothing: there the guard bans nothing, the reply goes on
    and completes valid."""
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": ITEM,
                                                         "minItems": 3}},
              "required": ["items"]}
    m = _guard(compiler, table, schema, repeats=1)
    text = '{"items": [{"a": "x"}, {"a": "x"}'
    kept, back = _feed(m, tokenizer, text)
    assert back > 0
    head = _text(tokenizer, kept)
    newline = tokenizer.encode("\n", add_special_tokens=False)
    for t in tokenizer.encode(text[len(head):text.index("}") + 1], add_special_tokens=False):
        assert m.accept_token(t)
    for _ in range(64):
        if any("," in t for t in _allowed_text(m, compiler, tokenizer)):
            break
        assert m.accept_token(newline[0]), m.error()
    else:
        pytest.fail("the guard kept every comma banned where the array may not end")
    for t in tokenizer.encode(', {"a": "y"}, {"a": "z"}]}', add_special_tokens=False):
        assert m.accept_token(t), m.error()
    assert m.accept_token(tokenizer.eos_token_id) and m.is_terminated()
