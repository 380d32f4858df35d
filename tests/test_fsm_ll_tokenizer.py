"""llguidance's token trie keeps plain added tokens (Qwen's ``<tool_call>``, ``<think>``) as their
text, so a grammar whose literal is the marker accepts the one-token marker the model writes;
special added tokens (``<|im_end|>``) stay special. On a synthetic byte-level BPE tokenizer."""

from __future__ import annotations

import json

import llguidance
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from grammarserve.fsm.backends.ll_tokenizer import from_hf_tokenizer, llguidance_tokenizer_json

_BYTES = [chr(c) for c in range(ord("!"), ord("~") + 1)] + ["Ġ", "Ċ"]


def _tokenizer() -> PreTrainedTokenizerFast:
    vocab = {c: i for i, c in enumerate(_BYTES)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|im_end|>", special=True, normalized=False)])
    tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=False),
                    AddedToken("</tool_call>", special=False, normalized=False)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")


@pytest.fixture(scope="module")
def hf() -> PreTrainedTokenizerFast:
    return _tokenizer()


def _ids(hf: PreTrainedTokenizerFast) -> tuple[int, int, int]:
    return (hf.convert_tokens_to_ids("<|im_end|>"), hf.convert_tokens_to_ids("<tool_call>"),
            hf.convert_tokens_to_ids("</tool_call>"))


def test_llguidance_alone_makes_the_plain_marker_special(hf: PreTrainedTokenizerFast) -> None:
    """Why the rewrite exists: llguidance.hf.from_tokenizer ignores ``special: false``."""
    import llguidance.hf

    _, call, _ = _ids(hf)
    ll = llguidance.hf.from_tokenizer(hf, n_vocab=len(hf))
    assert ll.is_special_token(call)


def test_plain_markers_become_text_and_special_ones_stay(hf: PreTrainedTokenizerFast) -> None:
    end, call, close = _ids(hf)
    ll = from_hf_tokenizer(hf, len(hf), [end])
    assert ll.is_special_token(end)
    assert not ll.is_special_token(call) and ll.decode_bytes([call]) == b"<tool_call>"
    assert not ll.is_special_token(close) and ll.decode_bytes([close]) == b"</tool_call>"
    assert ll.vocab_size == len(hf)


def test_grammar_literal_accepts_the_one_token_marker(hf: PreTrainedTokenizerFast) -> None:
    end, call, close = _ids(hf)
    ll = from_hf_tokenizer(hf, len(hf), [end])
    grammar = llguidance.LLMatcher.grammar_from_lark('start: "<tool_call>" "ab" "</tool_call>"')
    m = llguidance.LLMatcher(ll, grammar)
    ids = [call, *hf.encode("ab", add_special_tokens=False), close, end]
    for token in ids:
        assert m.consume_token(token), m.get_error()
    assert m.is_stopped() or m.is_accepting()


def test_non_byte_level_json_is_unchanged() -> None:
    raw = json.dumps({"model": {"type": "Unigram", "vocab": []}, "decoder": None,
                      "added_tokens": [{"id": 0, "content": "<x>", "special": False}]})
    assert llguidance_tokenizer_json(raw) == raw
