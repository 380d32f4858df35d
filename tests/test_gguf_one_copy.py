"""A GGUF's quantized tensors stay in the GGUF, one copy: the converted folder holds only the
unquantized ones (norms), the loader reads the others dense only where it has no kernel for them
(``gguf_convert.GGUFWeights``), and a folder whose GGUF is gone says so."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from gguf import GGUFReader
from safetensors import safe_open

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import model_shapes  # noqa: E402

from grammarserve.errors import ModelLoadError  # noqa: E402
from grammarserve.models.gguf_convert import WEIGHTS_FILE, GGUFWeights, gguf_to_hf_folder  # noqa: E402
from grammarserve.models.linear import Linear  # noqa: E402
from grammarserve.models.loader import load_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_shapes.make_gguf("smollm2-tiny", tmp_path_factory.mktemp("gguf"), qtype="Q4_1")


def test_the_folder_holds_only_the_unquantized_tensors(tiny_gguf: Path, tmp_path: Path) -> None:
    folder = gguf_to_hf_folder(tiny_gguf, tmp_path)
    types = {t.name: t.tensor_type.name for t in GGUFReader(tiny_gguf).tensors}
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        written = set(f.keys())
    left = json.loads((folder / WEIGHTS_FILE).read_text())
    assert Path(left["source"]) == tiny_gguf.resolve()
    assert written and all(name.endswith("norm.weight") for name in written), written
    assert {v["type"] for v in left["tensors"].values()} == {"Q4_1", "Q8_0"}
    assert len(written) + len(left["tensors"]) == len(
        [n for n in types if n != "rope_freqs.weight"])
    assert left["tensors"]["model.embed_tokens.weight"]["type"] == types["token_embd.weight"]


def test_weights_without_blocks_are_read_dense_from_the_gguf(tiny_gguf: Path,
                                                             tmp_path: Path) -> None:
    blocks = load_model(str(tiny_gguf), cache_dir=tmp_path)
    dense = load_model(str(tiny_gguf), cache_dir=tmp_path, gguf_blocks=False)
    for (name, a), b in zip(((n, m) for n, m in blocks.model.named_modules()
                             if isinstance(m, Linear)),
                            (m for m in dense.model.modules() if isinstance(m, Linear)),
                            strict=True):
        assert b.weight.device.type == "cpu" and torch.equal(a.dense(), b.weight), name
    ids = torch.arange(0, 40).view(2, 20)
    assert torch.equal(blocks.model.embed_tokens(ids), dense.model.embed_tokens(ids))


def test_a_folder_whose_gguf_is_gone_names_it(tiny_gguf: Path, tmp_path: Path) -> None:
    copy = tmp_path / "moved.gguf"
    copy.write_bytes(tiny_gguf.read_bytes())
    folder = gguf_to_hf_folder(copy, tmp_path / "cache")
    copy.unlink()
    with pytest.raises(ModelLoadError, match="moved.gguf.*no longer exists"):
        load_model(str(folder), gguf_blocks=False)
    assert "model.embed_tokens.weight" in GGUFWeights(folder)
