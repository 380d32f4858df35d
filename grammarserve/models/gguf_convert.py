"""Convert a GGUF file once into a cached Hugging Face folder (config.json, safetensors, tokenizer).

The folder holds the config, the tokenizer and chat template (from transformers' GGUF support)
and the tensors the GGUF stores unquantized (F32/F16/BF16: norms, biases, some embeddings). The
quantized tensors stay in the GGUF, one copy: ``gguf_tensors.json`` lists them, and
:class:`GGUFWeights` dequantizes one on demand for a loader that needs it dense (the CPU kernels
read the blocks themselves, see ``quant_weights.py``). Later starts load the folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from grammarserve.errors import ModelLoadError, UnsupportedModelError
from grammarserve.models.config import RopeScaling
from grammarserve.models.rope import rope_inv_freq

# GGUF general.architecture -> (HF architecture, HF model_type)
_ARCHS = {
    "llama": ("LlamaForCausalLM", "llama"),
    "mistral": ("MistralForCausalLM", "mistral"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
#: GGUF types the converter writes into the folder; the others stay in the GGUF.
_STORED_TYPES = ("F32", "F16", "BF16")
#: In a converted folder: the source GGUF and the weights left in it (see :class:`GGUFWeights`).
WEIGHTS_FILE = "gguf_tensors.json"
_FORMAT = "g2"  # in the folder name: folders of the format that wrote every tensor dense differ
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def default_cache_dir() -> Path:
    """``$GRAMMARSERVE_CACHE`` or ``$XDG_CACHE_HOME/grammarserve`` (``~/.cache/grammarserve``)."""
    if env := os.environ.get("GRAMMARSERVE_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "grammarserve"


def _fingerprint(path: Path) -> str:
    """Cheap identity of a large file: size plus hashes of its first and last MiB."""
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(str(size).encode())
    with path.open("rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read(1 << 20))
    return h.hexdigest()[:16]


def gguf_to_hf_folder(gguf_path: Path, cache_dir: Path | None = None) -> Path:
    """Return a cached HF folder for ``gguf_path``, converting it on first use."""
    if not gguf_path.is_file():
        raise ModelLoadError(f"GGUF file {gguf_path} does not exist")
    target = ((cache_dir or default_cache_dir())
              / f"{gguf_path.stem}-{_fingerprint(gguf_path)}-{_FORMAT}")
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        _convert(gguf_path, tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def read_gguf(gguf_path: Path) -> Any:
    """Open ``gguf_path`` with ``gguf.GGUFReader`` (memory-mapped), as a ModelLoadError if bad."""
    import gguf

    try:
        return gguf.GGUFReader(str(gguf_path))
    except Exception as e:  # the reader raises ValueError, struct.error, IndexError, ...
        raise ModelLoadError(f"{gguf_path} is not a readable GGUF file: {e}") from None


def _convert(gguf_path: Path, out: Path) -> None:
    import torch
    from safetensors.torch import save_file

    reader = read_gguf(gguf_path)
    meta = {k: _field(f) for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.")}
    arch = meta.get("general.architecture")
    if arch not in _ARCHS:
        raise UnsupportedModelError(
            f"GGUF architecture {arch!r} is not supported (supported: {', '.join(_ARCHS)})"
        )
    tensors: dict[str, torch.Tensor] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    left: dict[str, dict[str, Any]] = {}
    n_head = int(meta[f"{arch}.attention.head_count"])
    n_kv = int(meta.get(f"{arch}.attention.head_count_kv", n_head))
    rope_factors = None
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            rope_factors = np.asarray(t.data, dtype=np.float32).reshape(-1)
            continue
        name = _hf_name(t.name)
        if name is None:
            continue
        shapes[name] = tuple(int(x) for x in reversed(t.shape))
        if t.tensor_type.name not in _STORED_TYPES:
            left[name] = {"gguf": t.name, "type": t.tensor_type.name,
                          "elements": int(t.n_elements)}
            continue
        tensors[name] = torch.from_numpy(np.array(_dense(t, arch, n_head, n_kv), copy=True,
                                                  order="C"))
    if "model.embed_tokens.weight" not in shapes:
        raise ModelLoadError(f"{gguf_path} has no token_embd.weight tensor")
    config = _hf_config(meta, arch, shapes, reader)
    if rope_factors is not None:
        config["rope_scaling"] = llama3_scaling_from_factors(
            rope_factors, config["head_dim"], config["rope_theta"], gguf_path)
    save_file(tensors, str(out / "model.safetensors"))
    (out / WEIGHTS_FILE).write_text(json.dumps(
        {"source": str(gguf_path.resolve()), "tensors": left}, indent=1))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    _save_tokenizer(gguf_path, out, len(tokens.data) if tokens is not None else None)


def _dense(t: Any, arch: str, n_head: int, n_kv: int) -> np.ndarray:
    """GGUF tensor ``t`` dense in HF orientation (fp32, or as stored for F32/F16)."""
    arr = _dequantize(t)
    # NOTE: llama.cpp permutes Q/K rows of llama-arch models for its RoPE layout; undo it.
    if arch in ("llama", "mistral") and t.name.endswith((".attn_q.weight", ".attn_k.weight")):
        arr = unpermute_rows(arr, n_head if ".attn_q." in t.name else n_kv)
    return arr


class GGUFWeights:
    """The weights a converted folder left in its GGUF (``WEIGHTS_FILE``), by HF name, each
    dequantized to fp32 on demand (llama's Q/K rows unpermuted). ``source`` overrides the GGUF
    path the folder recorded (the file the user named). The GGUF is opened on first read."""

    def __init__(self, folder: Path, source: Path | None = None) -> None:
        file = folder / WEIGHTS_FILE
        data = json.loads(file.read_text()) if file.is_file() else {"source": "", "tensors": {}}
        self.left: dict[str, dict[str, Any]] = data["tensors"]
        self.source = source or Path(data["source"])
        self._reader: dict[str, Any] | None = None  # GGUF tensor name -> tensor, once open
        self._heads: tuple[str, int, int] = ("", 0, 0)  # architecture, heads, KV heads

    def __contains__(self, name: str) -> bool:
        return name in self.left

    def types(self) -> dict[str, tuple[str, int]]:
        """HF name -> (GGUF type, elements) of every weight left in the GGUF."""
        return {k: (v["type"], int(v["elements"])) for k, v in self.left.items()}

    def read(self, name: str) -> np.ndarray:
        """Weight ``name`` dense (fp32); a ModelLoadError where the GGUF is gone or unreadable."""
        if self._reader is None:
            if not self.source.is_file():
                raise ModelLoadError(f"weight {name!r} is in the GGUF {self.source}, which no "
                                     "longer exists; pass the GGUF file again")
            reader = read_gguf(self.source)
            arch = reader.fields["general.architecture"].contents()
            n_head = int(reader.fields[f"{arch}.attention.head_count"].contents())
            kv = reader.fields.get(f"{arch}.attention.head_count_kv")
            self._heads = (arch, n_head, int(kv.contents()) if kv is not None else n_head)
            self._reader = {t.name: t for t in reader.tensors}
        gguf_name = self.left[name]["gguf"]
        if gguf_name not in self._reader:
            raise ModelLoadError(f"{self.source} has no tensor {gguf_name!r}")
        return _dense(self._reader[gguf_name], *self._heads)


def _field(f: Any) -> Any:
    try:
        return f.contents()
    except Exception:
        return None


def _hf_name(name: str) -> str | None:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return None


def _dequantize(t: Any) -> np.ndarray:
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize

    if t.tensor_type in (Q.F32, Q.F16):
        arr = np.asarray(t.data)
    elif t.tensor_type == Q.BF16:
        arr = dequantize(t.data, t.tensor_type).astype(np.float32)
    else:
        arr = dequantize(t.data, t.tensor_type).astype(np.float32)
    shape = tuple(int(x) for x in reversed(t.shape))
    return arr.reshape(shape)


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (works on dense rows and on rows of GGUF blocks)."""
    rows = w.shape[0]
    return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama3_scaling_from_factors(factors: np.ndarray, head_dim: int, theta: float,
                                source: Path) -> dict[str, Any]:
    """The ``rope_scaling`` dict of a ``rope_freqs.weight`` tensor (llama.cpp stores Llama 3.1's
    scaling as per-frequency divisors and not as parameters).

    The divisors are matched against Llama 3.x's published parameters (low 1, high 4, original
    context 8192) with the largest divisor as ``factor``; other divisors raise
    UnsupportedModelError, since no parameter set reproduces them.
    """
    fit = RopeScaling(rope_type="llama3", factor=float(factors.max()), low_freq_factor=1.0,
                      high_freq_factor=4.0, original_max_position_embeddings=8192)
    plain = rope_inv_freq(head_dim, theta, RopeScaling())
    expected = (plain / rope_inv_freq(head_dim, theta, fit)).numpy()
    if factors.shape != expected.shape or not np.allclose(factors, expected, rtol=1e-4):
        raise UnsupportedModelError(
            f"{source} stores per-frequency RoPE factors that match no Llama 3 rope_scaling "
            f"(factor {fit.factor:g}, low 1, high 4, original context 8192); load the "
            "Hugging Face folder instead"
        )
    return dataclasses.asdict(fit)


def _hf_config(meta: dict[str, Any], arch: str, shapes: dict[str, tuple[int, ...]],
               reader: Any) -> dict[str, Any]:
    hf_arch, model_type = _ARCHS[arch]
    heads = int(meta[f"{arch}.attention.head_count"])
    hidden = int(meta[f"{arch}.embedding_length"])
    key_len = meta.get(f"{arch}.attention.key_length")
    tok = {k: _field(f) for k, f in reader.fields.items()
           if k in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id")}
    cfg: dict[str, Any] = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "vocab_size": int(shapes["model.embed_tokens.weight"][0]),
        "hidden_size": hidden,
        "intermediate_size": int(meta[f"{arch}.feed_forward_length"]),
        "num_hidden_layers": int(meta[f"{arch}.block_count"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": int(key_len) if key_len else hidden // heads,
        "rms_norm_eps": float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(meta.get(f"{arch}.context_length", 4096)),
        "tie_word_embeddings": "lm_head.weight" not in shapes,
        "attention_bias": "model.layers.0.self_attn.q_proj.bias" in shapes,
        "bos_token_id": tok.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": tok.get("tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
    }
    if meta.get(f"{arch}.rope.scaling.type") == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear",
                               "factor": float(meta[f"{arch}.rope.scaling.factor"])}
    return cfg


def _save_tokenizer(gguf_path: Path, out: Path, n_tokens: int | None) -> None:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except Exception as e:
        raise ModelLoadError(f"cannot read the tokenizer of {gguf_path}: {e}") from None
    tok.save_pretrained(str(out))
    if n_tokens is not None and len(tok) > n_tokens:
        _drop_tokens_from(out, n_tokens)


def _drop_tokens_from(folder: Path, n_tokens: int) -> None:
    """Remove the added tokens of id ``n_tokens`` and above from a saved tokenizer.

    NOTE: transformers' GGUF loader builds byte-level vocabularies with GPT2Tokenizer, whose
    default unk/bos/eos ``<|endoftext|>`` is added as a new token when the vocabulary lacks it
    (Llama 3's): one token past the GGUF's list and past the model's logits.
    """
    file = folder / "tokenizer.json"
    data = json.loads(file.read_text())
    data["added_tokens"] = [a for a in data.get("added_tokens", []) if a["id"] < n_tokens]
    file.write_text(json.dumps(data, ensure_ascii=False))
    config_file = folder / "tokenizer_config.json"
    if config_file.is_file():
        config = json.loads(config_file.read_text())
        decoder = config.get("added_tokens_decoder") or {}
        config["added_tokens_decoder"] = {k: v for k, v in decoder.items() if int(k) < n_tokens}
        config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False))
