"""Prompt tokenization with the pieces between added tokens cached
(grammarserve/models/prompt_tokens.py): the same ids as one ``encode`` call on real chat prompts
(tool lists, every role, unicode, spaces, added-token text inside a message), the tool block
taken from the cache on the next request, the cache bounded, and no cache where splitting at
added tokens first would not be exact."""

from __future__ import annotations

from typing import Any

import pytest
from tiny_models import tiny_tokenizer
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from grammarserve.models.prompt_tokens import SegmentEncoder
from grammarserve.openai.protocol import ChatMessage
from grammarserve.openai.render import render_chat

_TOOLS = [{"type": "function", "function": {
    "name": f"{verb}_{noun}", "description": f"{verb.title()} a {noun} (see the docs at "
    f"https://example.com/{noun}, 'quoted', \"double\", tabs\tand  spaces).",
    "parameters": {"type": "object", "required": ["id"], "properties": {
        "id": {"type": "string"}, "count": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}},
        "mode": {"type": "string", "enum": ["fast", "slow", "naïve", "日本"]}}}}}
    for verb in ("get", "create", "delete", "list") for noun in ("order", "ticket", "file")]

_CHATS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "What's the weather in Lisbon right now, in celsius?"}],
    [{"role": "system", "content": "You are terse.\n\n  Indented line.\t"},
     {"role": "user", "content": " leading space and trailing  "}],
    [{"role": "user", "content": "Ça va? 日本語のテキスト 🙂 and \u00a0nbsp"},
     {"role": "assistant", "content": "Oui.\n"},
     {"role": "user", "content": "Write <|im_end|> literally, and <|im_start|>user too."}],
    [{"role": "user", "content": "Get order 12"},
     {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
      "function": {"name": "get_order", "arguments": "{\"id\": \"12\"}"}}]},
     {"role": "tool", "tool_call_id": "c1", "content": "{\"status\": \"shipped\"}"},
     {"role": "user", "content": "\n\nThanks!\n\n"}],
]


@pytest.mark.model
@pytest.mark.parametrize("with_tools", [False, True])
def test_cached_pieces_give_the_one_call_ids_on_real_chat_prompts(tokenizer, with_tools) -> None:  # type: ignore[no-untyped-def]
    enc = SegmentEncoder(tokenizer, min_chars=0)
    assert enc.enabled
    for _ in range(2):  # cold, then every piece from the cache
        for chat in _CHATS:
            text = render_chat(tokenizer, [ChatMessage(**m) for m in chat],
                               tools=_TOOLS if with_tools else None)
            assert enc.encode(text) == tokenizer.encode(text, add_special_tokens=False)
    assert enc.hits > 0


@pytest.mark.model
def test_the_tool_block_comes_from_the_cache_on_the_next_request(tokenizer) -> None:  # type: ignore[no-untyped-def]
    enc = SegmentEncoder(tokenizer)
    for i, q in enumerate(("What's the weather?", "Send an e-mail to ana@example.com.")):
        text = render_chat(tokenizer, [ChatMessage(role="user", content=q)], tools=_TOOLS)
        assert enc.encode(text) == tokenizer.encode(text, add_special_tokens=False)
        assert enc.hits == i  # the second request finds the system piece (the tools)
    text = render_chat(tokenizer, [ChatMessage(role="user", content="Hi")], tools=_TOOLS)
    assert SegmentEncoder(tokenizer).encode(text) == tokenizer.encode(text,
                                                            add_special_tokens=False)


def _tokenizer(pre: Any, added: AddedToken) -> PreTrainedTokenizerFast:
    vocab = {c: i for i, c in enumerate("▁abcdefghijklmnopqrstuvwxyz .,!?\n'")}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.pre_tokenizer = pre
    tok.add_special_tokens([added])
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_no_cache_where_splitting_at_added_tokens_is_not_exact() -> None:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert SegmentEncoder(_tokenizer(byte_level, AddedToken("<s>", special=True))).enabled
    stripping = _tokenizer(byte_level, AddedToken("<s>", special=True, lstrip=True))
    meta = _tokenizer(pre_tokenizers.Metaspace(prepend_scheme="first"),
                      AddedToken("<s>", special=True))
    for tok in (stripping, meta):
        enc = SegmentEncoder(tok, min_chars=0)
        assert not enc.enabled
        text = "ab <s> cd<s>e f"
        assert enc.encode(text) == tok.encode(text, add_special_tokens=False)


def test_the_cache_is_bounded_least_recently_used_first() -> None:
    hf_tokenizer = tiny_tokenizer()  # its own: an added token here must not reach other tests
    hf_tokenizer.add_special_tokens({"additional_special_tokens": ["<|sep|>"]})
    enc = SegmentEncoder(hf_tokenizer, min_chars=4, max_entries=2)
    assert enc.enabled
    pieces = ["first piece", "second piece", "third piece"]
    for p in pieces:
        text = f"{p}<|sep|>x"
        assert enc.encode(text) == hf_tokenizer.encode(text, add_special_tokens=False)
    assert list(enc._cache) == pieces[1:]  # "x" is under min_chars; the first went out
    enc.encode("second piece<|sep|>")
    assert list(enc._cache) == ["third piece", "second piece"] and enc.hits == 1
