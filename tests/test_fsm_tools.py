"""Tool-call grammars (Hermes format) as whole-output grammars: ``required``, named and ``auto``
(free text, then calls once ``<tool_call>`` is written), walked on real SmolLM2 tokenizations
and on a synthetic vocabulary whose tokens straddle the trigger and the end tag."""

from __future__ import annotations

from typing import Any

import pytest
from walk_helpers import walk_jump_forward

from grammarserve.errors import GrammarError, StrictSchemaError, UnsupportedSchemaError
from grammarserve.fsm import CompiledGrammar, GrammarCompiler
from grammarserve.fsm.conformance import bit, walk

EOS = 2
WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                           "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}, "n": {"$ref": "#/$defs/N"}},
        "required": ["q"], "$defs": {"N": {"type": "integer", "minimum": 1}}}}},
]
CALL_W = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "unit": "c"}}\n' \
         '</tool_call>'
CALL_S = '<tool_call>\n{"name": "search", "arguments": {"q": "pizza", "n": 3}}\n</tool_call>'


@pytest.fixture(scope="module")
def compiler(tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer)


def run(compiler: GrammarCompiler, tokenizer: Any, grammar: CompiledGrammar,
        text: str) -> tuple[bool, str]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return walk(grammar.matcher(), ids, EOS, compiler.allocate_bitmask(1))


def accepts(compiler: GrammarCompiler, tokenizer: Any, grammar: CompiledGrammar,
            text: str) -> bool:
    return run(compiler, tokenizer, grammar, text)[0]


def masked(compiler: GrammarCompiler, tokenizer: Any, grammar: CompiledGrammar,
           text: str) -> bool:
    """The walk of ``text`` is stopped by the mask (not only by ``accept_token``)."""
    ok, reason = run(compiler, tokenizer, grammar, text)
    return not ok and "masked out" in reason


# -- SmolLM2 ------------------------------------------------------------------------------------
@pytest.mark.model
def test_required_and_named(compiler: GrammarCompiler, tokenizer: Any) -> None:
    required = compiler.compile_tool_calls(TOOLS, "required")
    assert accepts(compiler, tokenizer, required, CALL_W)
    assert accepts(compiler, tokenizer, required, CALL_S + "\n" + CALL_W)
    assert accepts(compiler, tokenizer, required, CALL_S + CALL_W + "\n")
    assert masked(compiler, tokenizer, required, CALL_S.replace('"n": 3', '"n": 0'))
    assert masked(compiler, tokenizer, required, CALL_W.replace("get_weather", "get_time"))
    assert masked(compiler, tokenizer, required, "Sure! " + CALL_W)
    assert masked(compiler, tokenizer, required, "")
    assert masked(compiler, tokenizer, required, CALL_W + " done")
    single = compiler.compile_tool_calls(TOOLS, "required", parallel=False)
    assert accepts(compiler, tokenizer, single, CALL_S)  # the reply ends right after its call
    assert masked(compiler, tokenizer, single, CALL_S + "\n")
    assert masked(compiler, tokenizer, single, CALL_S + "\n" + CALL_W)
    named = compiler.compile_tool_calls(TOOLS, {"type": "function",
                                                "function": {"name": "search"}})
    assert accepts(compiler, tokenizer, named, CALL_S)
    assert masked(compiler, tokenizer, named, CALL_W)
    assert masked(compiler, tokenizer, named, CALL_S + "\n" + CALL_S)


@pytest.mark.parametrize("text", [
    "",  # nothing at all
    "The weather in Rome is sunny today.",
    "Use <b>bold</b>, a <tool> tag or <tool_call without its bracket.\nBye",
    "Let me check.\n" + CALL_W,
    CALL_W,
    CALL_W + "\n" + CALL_S + "\n",
    "Two calls:" + CALL_S + CALL_W,
    "Sure." + CALL_W,  # `.<` straddles the text and the trigger
    "日本語のテキスト " + CALL_S,
])
@pytest.mark.model
def test_auto_accepts(compiler: GrammarCompiler, tokenizer: Any, text: str) -> None:
    auto = compiler.compile_tool_calls(TOOLS, "auto")
    ok, reason = run(compiler, tokenizer, auto, text)
    assert ok, reason


@pytest.mark.parametrize("text", [
    CALL_W.replace("get_weather", "get_time"),  # unknown tool
    "Checking. " + CALL_W.replace('"c"', '"k"'),  # argument outside its enum
    CALL_S.replace('"n": 3', '"n": 0'),  # argument below its minimum
    CALL_W.replace('"unit": "c"', '"unit": "c", "x": 1'),  # additionalProperties: false
    "Hi <tool_call> there",  # the trigger must be followed by a call
    "Hi <tool_call>\n{\"name\": \"search\"}\n</tool_call>",  # arguments missing
    CALL_W + " and more text",  # nothing but whitespace after the last call
    CALL_W + "\n\nSure." + CALL_S,
    CALL_W[:-3],  # the stop token inside a call
])
@pytest.mark.model
def test_auto_refuses_by_mask(compiler: GrammarCompiler, tokenizer: Any, text: str) -> None:
    auto = compiler.compile_tool_calls(TOOLS, "auto")
    ok, reason = run(compiler, tokenizer, auto, text)
    assert not ok and "masked out" in reason, reason


@pytest.mark.model
def test_auto_token_boundaries(compiler: GrammarCompiler, tokenizer: Any) -> None:
    auto = compiler.compile_tool_calls(TOOLS, "auto")
    ids = tokenizer.encode("Sure." + CALL_W, add_special_tokens=False)
    straddle = tokenizer.convert_tokens_to_ids(".<")
    assert ids[1] == straddle  # "Sure", ".<", "tool", "_", "call", ">", ...
    m, bitmask = auto.matcher(), compiler.allocate_bitmask(1)
    for t in ids[:5]:  # up to "<tool_call"
        assert m.accept_token(t)
    m.fill_bitmask(bitmask, 0)
    close, bad = tokenizer.convert_tokens_to_ids([">", ">>"])
    assert bit(bitmask, 0, close) and bit(bitmask, 0, EOS)  # still plain text
    assert not bit(bitmask, 0, bad)  # "<tool_call>>" is a trigger followed by no call
    assert m.accept_token(close)
    m.fill_bitmask(bitmask, 0)
    assert not bit(bitmask, 0, EOS) and not bit(bitmask, 0, close)
    # Text that only looks like the start of the trigger stays free.
    m2 = auto.matcher()
    for t in tokenizer.encode("a <tool", add_special_tokens=False):
        assert m2.accept_token(t)
    m2.fill_bitmask(bitmask, 0)
    assert bit(bitmask, 0, tokenizer.convert_tokens_to_ids("box")) and bit(bitmask, 0, EOS)


@pytest.mark.model
def test_auto_single_call_and_jump_forward(compiler: GrammarCompiler, tokenizer: Any) -> None:
    import xgrammar as xgr

    single = compiler.compile_tool_calls(TOOLS, "auto", parallel=False)
    assert accepts(compiler, tokenizer, single, "ok " + CALL_W)
    assert masked(compiler, tokenizer, single, "ok " + CALL_W + "\n")
    assert masked(compiler, tokenizer, single, CALL_W + "\n" + CALL_S)
    token_bytes = xgr.TokenizerInfo.from_huggingface(tokenizer).decoded_vocab
    auto = compiler.compile_tool_calls(TOOLS, "auto")
    total = 0
    for text in ("Let me look.\n" + CALL_W, CALL_S + "\n" + CALL_W, "No tool needed."):
        ok, reason, forced = walk_jump_forward(auto.matcher(), text, tokenizer,
                                               compiler.allocate_bitmask(1), EOS, token_bytes)
        assert ok, (text, reason)
        total += forced
    assert total > 0


@pytest.mark.model
def test_tool_call_errors(compiler: GrammarCompiler) -> None:
    with pytest.raises(GrammarError, match="not in 'tools'"):
        compiler.compile_tool_calls(TOOLS, {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(GrammarError, match="name must match"):
        compiler.compile_tool_calls([{"type": "function", "function": {"name": "a b"}}])
    with pytest.raises(GrammarError, match="tool_choice must be"):
        compiler.compile_tool_calls(TOOLS, "none")
    with pytest.raises(UnsupportedSchemaError) as info:
        compiler.compile_tool_calls([{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "not": {}}}}])
    assert info.value.path == "$.tools[0].function.parameters.not"
    with pytest.raises(StrictSchemaError):
        compiler.compile_tool_calls([{"type": "function", "function": {
            "name": "f", "strict": True, "parameters": {"type": "object"}}}])


# -- synthetic vocabulary: tokens that straddle the trigger and the end tag --------------------
EXTRA = [".<tool", '>\n{"', "_call>\n", "<tool_call>", 'ok<tool_call>\n{"name', "<tool_call>x",
         ">\n\n", '"}}\n</']


@pytest.fixture(scope="module")
def straddle_vocab() -> tuple[Any, dict[str, int]]:
    """Bytes (ids 1..256), EOS (id 0) and the multi-byte tokens of ``EXTRA``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    to_char = bytes_to_unicode()
    vocab = {"<eos>": 0}
    for b in range(256):
        vocab[to_char[b]] = len(vocab)
    ids = {}
    for piece in EXTRA:
        ids[piece] = vocab["".join(to_char[c] for c in piece.encode())] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>"), ids


def _b(text: str) -> list[int]:
    return [b + 1 for b in text.encode()]


def test_auto_straddling_tokens(straddle_vocab: tuple[Any, dict[str, int]]) -> None:
    tok, x = straddle_vocab
    compiler = GrammarCompiler(tok, max_whitespace=4, json_style="flexible")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}}}]
    auto = compiler.compile_tool_calls(tools, "auto")
    body = _b('name": "f", "arguments": {"city": "R"}}\n')

    def ok(ids: list[int]) -> bool:
        return walk(auto.matcher(), ids, 0, compiler.allocate_bitmask(1))[0]

    call = _b("<tool_call") + [x['>\n{"']] + body + _b("</tool_call>")
    assert ok(_b("hi") + call)
    assert ok(_b("hi") + [x[".<tool"], x["_call>\n"]] + _b('{"') + body + _b("</tool_call>"))
    assert ok(_b("hi ") + [x["<tool_call>"]] + _b('\n{"') + body + _b("</tool_call>"))
    # text, the whole trigger and the start of the JSON in one token
    assert ok([x['ok<tool_call>\n{"name']] + _b('": "f", "arguments": {"city": "R"}}\n')
              + _b("</tool_call>"))
    # the JSON's end and the end tag's start in one token; the end tag's end and the tail
    assert ok(_b("<tool_call") + [x['>\n{"']] + _b('name": "f", "arguments": {"city": "R')
              + [x['"}}\n</']] + _b("tool_call") + [x[">\n\n"]])
    assert ok(call + _b("\n") + [x["<tool_call>"]] + _b('\n{"') + body + _b("</tool_call>"))
    # the trigger followed by anything but a newline and a call is masked
    for bad in (_b("hi ") + [x["<tool_call>x"]], _b("hi <tool_call") + [x[">\n\n"]],
                call + _b("\n") + [x["<tool_call>x"]], call + _b(" x")):
        assert not ok(bad)


# -- shared free-text masks ---------------------------------------------------------------------
def test_free_text_state_tracks_trigger_and_utf8() -> None:
    from grammarserve.fsm.freetext import FreeTextMasks

    pieces = [b"Sure", b".<", b"tool", b"_", b"call", b">", b"\xe6\x97", b"\xa5", b"<tool_c"]
    free = FreeTextMasks(b"<tool_call>", pieces)
    assert free.advance((0, b""), 0) == (0, b"")
    state = free.advance((0, b""), 1)
    assert state == (1, b"")  # ".<" ends with the trigger's first byte
    for t, k in ((2, 5), (3, 6), (4, 10)):
        state = free.advance(state, t)
        assert state == (k, b"")
    assert free.advance(state, 5) is None  # the trigger is complete
    assert free.advance(None, 0) is None
    assert free.advance((0, b""), 6) == (0, b"\xe6\x97")  # half a character
    assert free.advance((0, b"\xe6\x97"), 7) == (0, b"")
    assert free.advance((10, b""), 8) == (7, b"")  # "<tool_call" + "<tool_c": restarts


@pytest.mark.model
def test_free_text_masks_equal_computed_masks(compiler: GrammarCompiler, tokenizer: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from grammarserve.fsm.freetext import FreeTextMasks

    texts = ["Hello <b>x</b> <tool and <tool_c but \u00e9 \u65e5\u672c", "Sure." + CALL_W + "\n",
             "x <<tool_call>\n" + CALL_S[len("<tool_call>\n"):]]
    shared = compiler.compile_tool_calls(TOOLS, "auto")
    for text in texts:  # fills the shared free-text masks
        assert run(compiler, tokenizer, shared, text)[0]
    monkeypatch.setattr(FreeTextMasks, "MAX_ENTRIES", 0)  # computed by llguidance every time
    computed = GrammarCompiler(tokenizer).compile_tool_calls(TOOLS, "auto")
    ma, mb = compiler.allocate_bitmask(1), compiler.allocate_bitmask(1)
    for text in texts:
        a, b = shared.matcher(), computed.matcher()
        ids = tokenizer.encode(text, add_special_tokens=False) + [EOS]
        for i, t in enumerate(ids):
            a.fill_bitmask(ma, 0)
            b.fill_bitmask(mb, 0)
            assert ma.equal(mb), (text, i)
            assert a.accept_token(t) and b.accept_token(t)
        back = len(ids) - 3  # into the free text again, across the trigger if any
        a.rollback(back)
        b.rollback(back)
        a.fill_bitmask(ma, 0)
        b.fill_bitmask(mb, 0)
        assert ma.equal(mb)
