"""Tiny random-weight models for loader tests (imported by test_loader*.py; not a test file).

Everything runs on tiny random-weight models written into ``tmp_path`` (no network, no downloads):
hidden 64, 2 layers, 4 heads, 2 KV heads, vocab 256. The reference is the transformers model the
folder was saved from, run with eager attention in fp32.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from grammarserve.attention.kv_pool import KVPool, ReqToTokenPool
from grammarserve.engine.model_runner import BatchEntry, ModelRunner
from grammarserve.models.loader import LoadedModel

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
DELETE = object()  # marker for edit_config: remove the key

# --------------------------------------------------------------------------------------------
# helpers


def tiny_tokenizer() -> Any:
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


def eos_byte_tokenizer() -> Any:
    """A byte-level BPE tokenizer with no merges and an ``<eos>`` token at id 0 (each byte's
    character follows, in ``ByteLevel.alphabet()`` order): grammars over single bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0}
    for ch in sorted(ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>")


def to_legacy_config(folder: Path) -> None:
    """Rewrite config.json the way transformers 4.x (and most Hub checkpoints) store RoPE:
    top-level ``rope_theta`` and ``rope_scaling`` instead of ``rope_parameters``."""
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    params = dict(cfg.pop("rope_parameters", None) or {})
    cfg["rope_theta"] = params.pop("rope_theta", 10000.0)
    if params.get("rope_type", "default") != "default":
        cfg["rope_scaling"] = params
    path.write_text(json.dumps(cfg, indent=2))


def build_tiny(family: str, overrides: dict[str, Any], folder: Path, tokenizer: Any, *,
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
        to_legacy_config(folder)
    return model


def edit_config(folder: Path, **changes: Any) -> None:
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    for key, value in changes.items():
        if value is DELETE:
            cfg.pop(key)
        else:
            cfg[key] = value
    path.write_text(json.dumps(cfg))


def prompt_ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (n,), generator=g).tolist()


def prompt_text(n: int, seed: int) -> str:
    """``n`` random printable ASCII characters (``n`` tokens for the byte-level tokenizer)."""
    g = torch.Generator().manual_seed(seed)
    return "".join(chr(c) for c in torch.randint(32, 127, (n,), generator=g).tolist())


def tiny_runner(lm: LoadedModel, capacity: int = 256, max_reqs: int = 4) -> ModelRunner:
    mc = lm.config
    pool = KVPool(capacity=capacity, num_layers=mc.num_layers, num_kv_heads=mc.num_kv_heads,
                  head_dim=mc.head_dim, dtype=torch.float32)
    table = ReqToTokenPool(max_reqs=max_reqs, max_context=128)
    return ModelRunner(lm.model, pool, table)


def all_logits(lm: LoadedModel, ids: list[int]) -> torch.Tensor:
    """Our logits for every position of ``ids``, run as one fresh prefill."""
    runner = tiny_runner(lm)
    runner.req_to_token.write(0, 0, runner.pool.alloc(len(ids)))
    batch = runner.build_batch([BatchEntry(0, 0, ids)])
    batch.logit_rows = torch.arange(len(ids))
    return runner.model(batch, runner.attn)


def hf_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def assert_human_message(exc: BaseException) -> str:
    msg = str(exc)
    assert msg.strip(), "empty error message"
    assert "Traceback" not in msg
    assert msg.count("\n") <= 2, f"error message is not a short human message: {msg!r}"
    return msg
