"""Loader bad input: every broken model path or file gives one clear ModelLoadError."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import (  # shared helpers of the loader tests
    DELETE,
    assert_human_message,
    build_tiny,
    edit_config,
    tiny_tokenizer,
)

from grammarserve.errors import ModelLoadError, UnsupportedModelError
from grammarserve.models.config import SUPPORTED_ARCHITECTURES, SUPPORTED_ROPE_TYPES
from grammarserve.models.loader import load_model


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("tiny_llama") / "model"
    ref = build_tiny("llama", {}, folder, tiny_tokenizer())
    return folder, ref
# --------------------------------------------------------------------------------------------
# 3. bad input


@pytest.fixture
def model_copy(tiny_llama: tuple[Path, torch.nn.Module], tmp_path: Path) -> Path:
    """A private, writable copy of the tiny Llama folder."""
    dst = tmp_path / "model"
    shutil.copytree(tiny_llama[0], dst)
    return dst


def test_missing_model_path(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such-model"
    with pytest.raises(ModelLoadError) as info:
        load_model(str(missing))
    msg = assert_human_message(info.value)
    assert str(missing) in msg
    assert "does not exist" in msg


def test_folder_without_model(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError) as info:
        load_model(str(tmp_path / "empty"))
    msg = assert_human_message(info.value)
    assert "config.json" in msg and str(tmp_path / "empty") in msg


def test_file_that_is_not_gguf(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\x00" * 64)
    with pytest.raises(ModelLoadError) as info:
        load_model(str(path))
    msg = assert_human_message(info.value)
    assert str(path) in msg and ".gguf" in msg


def test_unknown_architecture(model_copy: Path) -> None:
    edit_config(model_copy, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    with pytest.raises(UnsupportedModelError) as info:
        load_model(str(model_copy))
    msg = assert_human_message(info.value)
    assert "unknown architecture" in msg
    assert "GPT2LMHeadModel" in msg
    for arch in SUPPORTED_ARCHITECTURES:
        assert arch in msg


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_corrupt_safetensors(model_copy: Path, damage: str) -> None:
    path = model_copy / "model.safetensors"
    data = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(os.urandom(4096))
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_bytes(b"")
    with pytest.raises(ModelLoadError) as info:
        load_model(str(model_copy))
    msg = assert_human_message(info.value)
    assert "corrupt" in msg
    assert "model.safetensors" in msg


def test_no_safetensors_files(model_copy: Path) -> None:
    (model_copy / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError) as info:
        load_model(str(model_copy))
    msg = assert_human_message(info.value)
    assert "safetensors" in msg


@pytest.mark.parametrize("field", ["hidden_size", "num_attention_heads", "vocab_size",
                                   "intermediate_size", "num_hidden_layers"])
def test_config_missing_required_field(model_copy: Path, field: str) -> None:
    edit_config(model_copy, **{field: DELETE})
    with pytest.raises(ModelLoadError) as info:
        load_model(str(model_copy))
    msg = assert_human_message(info.value)
    assert field in msg
    assert "config.json" in msg


def test_config_malformed_field(model_copy: Path) -> None:
    edit_config(model_copy, hidden_size="sixty-four")
    with pytest.raises(ModelLoadError) as info:
        load_model(str(model_copy))
    msg = assert_human_message(info.value)
    assert "malformed" in msg


def test_config_not_json(model_copy: Path) -> None:
    (model_copy / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError) as info:
        load_model(str(model_copy))
    msg = assert_human_message(info.value)
    assert "config.json" in msg


def test_weight_missing_from_checkpoint(model_copy: Path) -> None:
    from safetensors.torch import load_file, save_file

    path = model_copy / "model.safetensors"
    tensors = load_file(str(path))
    missing = "model.layers.1.self_attn.k_proj.weight"
    del tensors[missing]
    save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError) as info:
        load_model(str(model_copy))
    msg = assert_human_message(info.value)
    assert missing in msg
    assert "missing" in msg


def test_weights_do_not_fit_config(model_copy: Path) -> None:
    edit_config(model_copy, intermediate_size=96)
    with pytest.raises(ModelLoadError) as info:
        load_model(str(model_copy))
    msg = str(info.value)
    assert "Traceback" not in msg
    assert "do not fit the config" in msg.splitlines()[0]
    assert "gate_up_proj" in msg


def test_missing_tokenizer(model_copy: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model_copy / name).unlink()
    with pytest.raises(ModelLoadError) as info:
        load_model(str(model_copy))
    msg = str(info.value)
    assert "Traceback" not in msg
    assert "tokenizer" in msg.splitlines()[0]


@pytest.mark.parametrize("content", [
    pytest.param(b"this is not a gguf file at all" * 10, id="garbage"),
    pytest.param(b"GGUF" + struct.pack("<I", 3) + b"\xff" * 40, id="bad-header"),
    pytest.param(b"", id="empty"),
])
def test_garbage_gguf(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "broken-model.gguf"
    path.write_bytes(content)
    cache = tmp_path / "cache"
    with pytest.raises(ModelLoadError) as info:
        load_model(str(path), cache_dir=cache)
    msg = assert_human_message(info.value)
    assert str(path) in msg
    assert "GGUF" in msg
    # a failed conversion leaves nothing behind in the cache
    assert not cache.exists() or not any(cache.iterdir())


def test_gguf_unsupported_architecture(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path = tmp_path / "tiny-gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError) as info:
        load_model(str(path), cache_dir=tmp_path / "cache")
    msg = assert_human_message(info.value)
    assert "gpt2" in msg and "llama" in msg


def _rope_error(folder: Path) -> str:
    with pytest.raises(UnsupportedModelError) as info:
        load_model(str(folder))
    return assert_human_message(info.value)


@pytest.mark.parametrize("key", ["rope_type", "type"])
def test_unsupported_rope_scaling_legacy_config(model_copy: Path, key: str) -> None:
    edit_config(model_copy, rope_scaling={key: "yarn", "factor": 4.0,
                                           "original_max_position_embeddings": 64})
    msg = _rope_error(model_copy)
    assert "yarn" in msg and "rope_scaling" in msg
    for rope_type in SUPPORTED_ROPE_TYPES:
        assert rope_type in msg


def test_unsupported_rope_scaling_tf5_config(model_copy: Path) -> None:
    edit_config(model_copy, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                              "factor": 4.0,
                                              "original_max_position_embeddings": 64})
    msg = _rope_error(model_copy)
    assert "yarn" in msg


def test_per_layer_sliding_window_is_refused(tmp_path: Path, hf_tokenizer: Any) -> None:
    """Qwen2 windows only layers >= max_window_layers; we refuse rather than run it wrong."""
    build_tiny("qwen2", {"sliding_window": 8, "use_sliding_window": True, "max_window_layers": 1},
           tmp_path / "m", hf_tokenizer)
    with pytest.raises(UnsupportedModelError, match="sliding-window"):
        load_model(str(tmp_path / "m"))

