"""The token trie llguidance builds for a Hugging Face tokenizer, with plain added tokens as text.

llguidance reads the tokenizer's JSON and treats every *added* token shaped like a marker
(``<tool_call>``, ``<think>``) as a special token, whose bytes are ``\\xff[id]`` rather than its
text, whatever the token's ``special`` flag says. Qwen2.5 and Qwen3 add ``<tool_call>``,
``</tool_call>``, ``<think>`` and ``</think>`` as ``"special": false`` tokens: the model writes
them as one token each and the text they stand for is the marker itself. Left special, a
grammar whose literal is ``<tool_call>`` could never accept that token: the mask would force the
marker spelled in pieces, and a jump-forward span re-tokenized by the model's tokenizer (one
token) fails the grammar.

:func:`llguidance_tokenizer_json` moves those tokens out of ``added_tokens`` and into the BPE
vocabulary (byte-level spelled), so llguidance gives them their text as bytes. Tokens the
tokenizer marks special (``<|im_end|>``, ``<|eot_id|>``) stay special. Only byte-level BPE
tokenizers are rewritten; others are returned unchanged.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import llguidance

from grammarserve.fsm.vocab import byte_level_chars


def _is_byte_level(tok: dict[str, Any]) -> bool:
    decoder = tok.get("decoder") or {}
    kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", ())}
    return (tok.get("model") or {}).get("type") == "BPE" and "ByteLevel" in kinds


def plain_added_tokens(tok: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``added_tokens`` entries of a tokenizer JSON that are not special."""
    return [a for a in tok.get("added_tokens", ()) if not a.get("special", False)]


def from_hf_tokenizer(hf_tokenizer: Any, n_vocab: int, eos_token: list[int]) -> Any:
    """``llguidance.hf.from_tokenizer`` with plain added tokens as text (see the module)."""
    return llguidance.LLTokenizer(hf_tokenizer_json(hf_tokenizer), n_vocab=n_vocab,
                                  eos_token=eos_token)


def hf_tokenizer_json(hf_tokenizer: Any) -> str:
    """The tokenizer JSON :func:`from_hf_tokenizer` builds llguidance's tokenizer from."""
    backend = copy.copy(hf_tokenizer.backend_tokenizer)
    backend.no_padding()
    backend.no_truncation()
    return llguidance_tokenizer_json(backend.to_str())


def llguidance_tokenizer_json(backend_json: str) -> str:
    """``backend_json`` (a ``tokenizers`` JSON) with its non-special added tokens made plain
    vocabulary entries of the same ids, for ``llguidance.LLTokenizer``; unchanged when there are
    none or the tokenizer is not byte-level BPE."""
    tok = json.loads(backend_json)
    plain = plain_added_tokens(tok)
    if not plain or not _is_byte_level(tok):
        return backend_json
    tok = copy.copy(tok)
    table = byte_level_chars()
    moved = {a["id"] for a in plain}
    vocab = {k: v for k, v in tok["model"]["vocab"].items() if v not in moved}
    for added in plain:
        vocab["".join(table[b] for b in added["content"].encode())] = added["id"]
    # NOTE: the tokenizers library numbers an added token absent from the vocabulary after it
    # (ignoring its "id"), so the special ones that stay added are put in the vocabulary too:
    # then each keeps its id.
    for added in tok["added_tokens"]:
        if added["id"] not in moved:
            vocab.setdefault(added["content"], added["id"])
    tok["model"] = {**tok["model"], "vocab": vocab}
    tok["added_tokens"] = [a for a in tok["added_tokens"] if a["id"] not in moved]
    return json.dumps(tok, ensure_ascii=False)
