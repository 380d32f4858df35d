"""Loader tests: HF-folder parity against transformers, ragged-batch correctness, bad input.

Everything runs on tiny random-weight models written into ``tmp_path`` (no network, no downloads):
hidden 64, 2 layers, 4 heads, 2 KV heads, vocab 256. The reference is the transformers model the
folder was saved from, run with eager attention in fp32.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from grammarserve.engine.kv_pool import KVPool, ReqToTokenPool
from grammarserve.engine.model_runner import BatchEntry, ModelRunner
from grammarserve.errors import ModelLoadError, UnsupportedModelError
from grammarserve.models.config import SUPPORTED_ARCHITECTURES, SUPPORTED_ROPE_TYPES
from grammarserve.models.loader import LoadedModel, load_model

VOCAB = 256
TINY: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
}
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
ATOL = 1e-4
_DELETE = object()  # marker for _edit_config: remove the key

# --------------------------------------------------------------------------------------------
# helpers


def _tokenizer() -> Any:
    """A byte-level BPE tokenizer with no merges: token id == byte value (vocab 256).

    Byte-level is what transformers 5 accepts for every family: AutoTokenizer picks the class from
    config.json's model_type (e.g. Qwen2Tokenizer, which imposes its own byte-level pre-tokenizer),
    so a WordLevel tokenizer would tokenize to nothing there.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_to_char = bytes_to_unicode()
    tok = Tokenizer(models.BPE(vocab={byte_to_char[b]: b for b in range(VOCAB)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@pytest.fixture(scope="module")
def hf_tokenizer() -> Any:
    return _tokenizer()


def _to_legacy_config(folder: Path) -> None:
    """Rewrite config.json the way transformers 4.x (and most Hub checkpoints) store RoPE:
    top-level ``rope_theta`` and ``rope_scaling`` instead of ``rope_parameters``."""
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    params = dict(cfg.pop("rope_parameters", None) or {})
    cfg["rope_theta"] = params.pop("rope_theta", 10000.0)
    if params.get("rope_type", "default") != "default":
        cfg["rope_scaling"] = params
    path.write_text(json.dumps(cfg, indent=2))


def _build(family: str, overrides: dict[str, Any], folder: Path, tokenizer: Any, *,
           legacy: bool = False, seed: int = 0) -> torch.nn.Module:
    """Save a random-weight transformers model (+ tokenizer) to ``folder``; return it (eval)."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    cfg_cls, model_cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    }[family]
    cfg = cfg_cls(**{**TINY, **overrides})
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_cls(cfg).float().eval()
    # HF init (std 0.02, unit norms, zero biases) gives near-zero logits, against which a 1e-4
    # tolerance says little; use larger weights and non-trivial norm gains and biases.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
    if legacy:
        _to_legacy_config(folder)
    return model


def _edit_config(folder: Path, **changes: Any) -> None:
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    for key, value in changes.items():
        if value is _DELETE:
            cfg.pop(key)
        else:
            cfg[key] = value
    path.write_text(json.dumps(cfg))


def _prompt_ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (n,), generator=g).tolist()


def _prompt_text(n: int, seed: int) -> str:
    """``n`` random printable ASCII characters (``n`` tokens for the byte-level tokenizer)."""
    g = torch.Generator().manual_seed(seed)
    return "".join(chr(c) for c in torch.randint(32, 127, (n,), generator=g).tolist())


def _runner(lm: LoadedModel, capacity: int = 256, max_reqs: int = 4) -> ModelRunner:
    mc = lm.config
    pool = KVPool(capacity=capacity, num_layers=mc.num_layers, num_kv_heads=mc.num_kv_heads,
                  head_dim=mc.head_dim, dtype=torch.float32)
    table = ReqToTokenPool(max_reqs=max_reqs, max_context=128)
    return ModelRunner(lm.model, pool, table)


def _all_logits(lm: LoadedModel, ids: list[int]) -> torch.Tensor:
    """Our logits for every position of ``ids``, run as one fresh prefill."""
    runner = _runner(lm)
    runner.req_to_token.write(0, 0, runner.pool.alloc(len(ids)))
    batch = runner.build_batch([BatchEntry(0, 0, ids)])
    batch.logit_rows = torch.arange(len(ids))
    return runner.model(batch, runner.attn)


def _hf_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def _assert_human_message(exc: BaseException) -> str:
    msg = str(exc)
    assert msg.strip(), "empty error message"
    assert "Traceback" not in msg
    assert msg.count("\n") <= 2, f"error message is not a short human message: {msg!r}"
    return msg


# --------------------------------------------------------------------------------------------
# 1. loader parity with transformers

PARITY_CASES = [
    pytest.param("llama", {}, False, id="llama"),
    pytest.param("llama", {"rope_theta": 500000.0}, True, id="llama-theta-legacy-config"),
    pytest.param("llama", {"rope_scaling": LLAMA3_SCALING}, True, id="llama3-rope-legacy-config"),
    pytest.param("llama", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, True,
                 id="linear-rope-legacy-config"),
    pytest.param("llama", {"rope_theta": 500000.0}, False, id="llama-theta-tf5-config"),
    pytest.param("llama", {"rope_scaling": LLAMA3_SCALING}, False, id="llama3-rope-tf5-config"),
    pytest.param("qwen2", {}, False, id="qwen2-qkv-bias"),
    pytest.param("qwen3", {"head_dim": 32}, False, id="qwen3-qknorm-head_dim32"),
    pytest.param("mistral", {"sliding_window": None}, False, id="mistral"),
    pytest.param("mistral", {"sliding_window": 8}, False, id="mistral-sliding-window-8"),
    pytest.param("llama", {"tie_word_embeddings": True}, False, id="llama-tied-embeddings"),
]


@pytest.mark.parametrize(("family", "overrides", "legacy"), PARITY_CASES)
def test_loader_parity(family: str, overrides: dict[str, Any], legacy: bool, tmp_path: Path,
                       hf_tokenizer: Any) -> None:
    ref = _build(family, overrides, tmp_path / "model", hf_tokenizer, legacy=legacy)
    lm = load_model(str(tmp_path / "model"))

    mc = lm.config
    assert mc.family == family
    assert (mc.vocab_size, mc.hidden_size, mc.num_layers) == (VOCAB, 64, 2)
    assert (mc.num_heads, mc.num_kv_heads) == (4, 2)
    assert mc.head_dim == overrides.get("head_dim", 16)
    assert mc.attention_bias == (family == "qwen2")
    assert mc.qk_norm == (family == "qwen3")
    assert mc.tie_word_embeddings == overrides.get("tie_word_embeddings", False)
    if mc.tie_word_embeddings:
        assert lm.model.lm_head.weight is lm.model.embed_tokens.weight
    assert lm.model.inv_freq.dtype == torch.float32

    text = _prompt_text(20, seed=1)
    ids = lm.tokenizer.encode(text, add_special_tokens=False)
    assert ids == list(text.encode())

    ours = _all_logits(lm, ids)
    want = _hf_logits(ref, ids)
    assert ours.shape == want.shape == (20, VOCAB)
    assert ours.dtype == torch.float32
    assert want.abs().max() > 0.5  # the tolerance below must be meaningful
    diff = (ours - want).abs().max().item()
    assert diff < ATOL, f"max abs logit diff {diff:.3g} vs transformers"


# Hub config.json files carry keys that the transformers config class normalises on load; the
# loader reads config.json itself, so it must apply the same rules.
CONFIG_FILE_CASES = [
    # Qwen2.5 checkpoints ship "sliding_window": 32768 with "use_sliding_window": false.
    pytest.param("qwen2", {}, {"sliding_window": 8, "use_sliding_window": False},
                 id="qwen2-window-disabled"),
    # Same for Qwen3: transformers drops the window when use_sliding_window is false, but
    # config.py only applies that rule to family "qwen2".
    pytest.param("qwen3", {"head_dim": 32}, {"sliding_window": 8, "use_sliding_window": False},
                 id="qwen3-window-disabled"),
    # With use_sliding_window, Qwen2 windows only layers >= max_window_layers (layer_types);
    # config.py / the attention backend window every layer.
]


@pytest.mark.parametrize(("family", "overrides", "edits"), CONFIG_FILE_CASES)
def test_loader_parity_config_file_keys(family: str, overrides: dict[str, Any],
                                        edits: dict[str, Any], tmp_path: Path,
                                        hf_tokenizer: Any) -> None:
    ref = _build(family, overrides, tmp_path / "model", hf_tokenizer)
    if edits:
        _edit_config(tmp_path / "model", **edits)
    lm = load_model(str(tmp_path / "model"))
    ids = _prompt_ids(20, seed=2)
    diff = (_all_logits(lm, ids) - _hf_logits(ref, ids)).abs().max().item()
    assert diff < ATOL, f"max abs logit diff {diff:.3g} vs transformers"


def test_load_bf16(tiny_llama: tuple[Path, torch.nn.Module]) -> None:
    lm = load_model(str(tiny_llama[0]), dtype=torch.bfloat16)
    assert lm.model.embed_tokens.weight.dtype == torch.bfloat16
    assert lm.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.bfloat16
    assert lm.model.inv_freq.dtype == torch.float32
    assert lm.model.lm_head.weight.dtype == torch.bfloat16


def test_load_bf16_keeps_exact_fp32_rope_frequencies(
        tiny_llama: tuple[Path, torch.nn.Module]) -> None:
    from grammarserve.models.rope import rope_inv_freq

    lm = load_model(str(tiny_llama[0]), dtype=torch.bfloat16)
    mc = lm.config
    want = rope_inv_freq(mc.head_dim, mc.rope_theta, mc.rope_scaling)
    assert torch.equal(lm.model.inv_freq, want)


def test_parity_cases_are_sensitive(tmp_path: Path, hf_tokenizer: Any) -> None:
    """The llama3 scaling and the sliding window must actually change the logits of a 20-token
    prompt, otherwise the parity cases above would not test them."""
    ids = _prompt_ids(20, seed=1)
    base = _hf_logits(_build("llama", {}, tmp_path / "a", hf_tokenizer), ids)
    scaled = _hf_logits(
        _build("llama", {"rope_scaling": LLAMA3_SCALING}, tmp_path / "b", hf_tokenizer), ids)
    assert (base - scaled).abs().max() > 1e-2
    full = _hf_logits(_build("mistral", {"sliding_window": None}, tmp_path / "c", hf_tokenizer),
                      ids)
    window = _hf_logits(_build("mistral", {"sliding_window": 8}, tmp_path / "d", hf_tokenizer),
                        ids)
    assert (full[:8] - window[:8]).abs().max() < ATOL
    assert (full[8:] - window[8:]).abs().max() > 1e-2


# --------------------------------------------------------------------------------------------
# 2. ragged batches on the tiny Llama


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("tiny_llama") / "model"
    ref = _build("llama", {}, folder, _tokenizer())
    return folder, ref


def test_ragged_batch_matches_single_forwards(tiny_llama: tuple[Path, torch.nn.Module]) -> None:
    folder, ref = tiny_llama
    lm = load_model(str(folder))
    # (table row, prefix already cached, total length): a fresh prefill, a long extend on a cached
    # prefix (own padded group), a short extend and a decode step (shared padded group).
    reqs = [(2, 0, 20), (0, 6, 24), (3, 10, 15), (1, 12, 13)]
    seqs = [_prompt_ids(n, seed=10 + i) for i, (_, _, n) in enumerate(reqs)]

    runner = _runner(lm, capacity=200, max_reqs=4)
    # Hand out the pool's slots in a random order so that no request has contiguous slots.
    slots = runner.pool.alloc(sum(n for _, _, n in reqs))
    slots = slots[torch.randperm(slots.numel(), generator=torch.Generator().manual_seed(0))]
    offset = 0
    for row, _, n in reqs:
        runner.req_to_token.write(row, 0, slots[offset:offset + n])
        offset += n

    # First forward: write the cached prefixes (itself a ragged batch of fresh prefills).
    prefix_entries = [BatchEntry(row, 0, seq[:p]) for (row, p, _), seq in zip(reqs, seqs) if p]
    runner.forward(prefix_entries)

    # Second forward: everything else, all four requests in one ragged batch.
    entries = [BatchEntry(row, p, seq[p:]) for (row, p, _), seq in zip(reqs, seqs)]
    batch = runner.build_batch(entries)
    lens = [n - p for _, p, n in reqs]
    ends = torch.tensor(lens).cumsum(0) - 1
    assert batch.logit_rows.tolist() == ends.tolist()
    assert batch.positions.tolist() == [q for _, p, n in reqs for q in range(p, n)]

    batch.logit_rows = torch.arange(sum(lens))
    ragged = runner.model(batch, runner.attn)
    start = 0
    for (row, p, n), seq in zip(reqs, seqs):
        got = ragged[start:start + n - p]
        single = _all_logits(lm, seq)[p:]
        want = _hf_logits(ref, seq)[p:]
        assert (got - single).abs().max().item() < ATOL, f"request in row {row} != single forward"
        assert (got - want).abs().max().item() < ATOL, f"request in row {row} != transformers"
        start += n - p


def test_prefill_then_decode_steps_match(tiny_llama: tuple[Path, torch.nn.Module]) -> None:
    """Chunked prefill followed by decode steps, one token per forward, equals one prefill."""
    folder, ref = tiny_llama
    lm = load_model(str(folder))
    seq = _prompt_ids(18, seed=3)
    runner = _runner(lm, capacity=64, max_reqs=2)
    row = runner.req_to_token.alloc()
    got = []
    pos = 0
    for chunk in (7, 5, 1, 1, 1, 1, 1, 1):
        runner.req_to_token.write(row, pos, runner.pool.alloc(chunk))
        got.append(runner.forward([BatchEntry(row, pos, seq[pos:pos + chunk])])[0])
        pos += chunk
    assert pos == len(seq)
    ends = torch.tensor([7, 5, 1, 1, 1, 1, 1, 1]).cumsum(0) - 1
    want = _hf_logits(ref, seq)[ends]
    assert (torch.stack(got) - want).abs().max().item() < ATOL


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
    msg = _assert_human_message(info.value)
    assert str(missing) in msg
    assert "does not exist" in msg


def test_folder_without_model(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError) as info:
        load_model(str(tmp_path / "empty"))
    msg = _assert_human_message(info.value)
    assert "config.json" in msg and str(tmp_path / "empty") in msg


def test_file_that_is_not_gguf(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\x00" * 64)
    with pytest.raises(ModelLoadError) as info:
        load_model(str(path))
    msg = _assert_human_message(info.value)
    assert str(path) in msg and ".gguf" in msg


def test_unknown_architecture(model_copy: Path) -> None:
    _edit_config(model_copy, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    with pytest.raises(UnsupportedModelError) as info:
        load_model(str(model_copy))
    msg = _assert_human_message(info.value)
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
    msg = _assert_human_message(info.value)
    assert "corrupt" in msg
    assert "model.safetensors" in msg


def test_no_safetensors_files(model_copy: Path) -> None:
    (model_copy / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError) as info:
        load_model(str(model_copy))
    msg = _assert_human_message(info.value)
    assert "safetensors" in msg


@pytest.mark.parametrize("field", ["hidden_size", "num_attention_heads", "vocab_size",
                                   "intermediate_size", "num_hidden_layers"])
def test_config_missing_required_field(model_copy: Path, field: str) -> None:
    _edit_config(model_copy, **{field: _DELETE})
    with pytest.raises(ModelLoadError) as info:
        load_model(str(model_copy))
    msg = _assert_human_message(info.value)
    assert field in msg
    assert "config.json" in msg


def test_config_malformed_field(model_copy: Path) -> None:
    _edit_config(model_copy, hidden_size="sixty-four")
    with pytest.raises(ModelLoadError) as info:
        load_model(str(model_copy))
    msg = _assert_human_message(info.value)
    assert "malformed" in msg


def test_config_not_json(model_copy: Path) -> None:
    (model_copy / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError) as info:
        load_model(str(model_copy))
    msg = _assert_human_message(info.value)
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
    msg = _assert_human_message(info.value)
    assert missing in msg
    assert "missing" in msg


def test_weights_do_not_fit_config(model_copy: Path) -> None:
    _edit_config(model_copy, intermediate_size=96)
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
    msg = _assert_human_message(info.value)
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
    msg = _assert_human_message(info.value)
    assert "gpt2" in msg and "llama" in msg


def _rope_error(folder: Path) -> str:
    with pytest.raises(UnsupportedModelError) as info:
        load_model(str(folder))
    return _assert_human_message(info.value)


@pytest.mark.parametrize("key", ["rope_type", "type"])
def test_unsupported_rope_scaling_legacy_config(model_copy: Path, key: str) -> None:
    _edit_config(model_copy, rope_scaling={key: "yarn", "factor": 4.0,
                                           "original_max_position_embeddings": 64})
    msg = _rope_error(model_copy)
    assert "yarn" in msg and "rope_scaling" in msg
    for rope_type in SUPPORTED_ROPE_TYPES:
        assert rope_type in msg


def test_unsupported_rope_scaling_tf5_config(model_copy: Path) -> None:
    _edit_config(model_copy, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                              "factor": 4.0,
                                              "original_max_position_embeddings": 64})
    msg = _rope_error(model_copy)
    assert "yarn" in msg


def test_per_layer_sliding_window_is_refused(tmp_path: Path, hf_tokenizer: Any) -> None:
    """Qwen2 windows only layers >= max_window_layers; we refuse rather than run it wrong."""
    _build("qwen2", {"sliding_window": 8, "use_sliding_window": True, "max_window_layers": 1},
           tmp_path / "m", hf_tokenizer)
    with pytest.raises(UnsupportedModelError, match="sliding-window"):
        load_model(str(tmp_path / "m"))
