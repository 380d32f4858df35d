"""Model configuration: the architecture facts the decoder needs, read from a HF config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grammarserve.errors import ModelLoadError, UnsupportedModelError

# HF `architectures` entry -> our family name.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling (``rope_scaling`` in HF configs)."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a Llama-family decoder."""

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    sliding_window: int | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        """Build from the parsed content of a Hugging Face ``config.json``."""
        archs = cfg.get("architectures") or []
        family = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES),
                      None)
        if family is None:
            model_type = cfg.get("model_type")
            by_type = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3"}
            family = by_type.get(str(model_type)) if not archs else None
        if family is None:
            raise UnsupportedModelError(
                f"unknown architecture {archs or cfg.get('model_type')!r}: grammarserve supports "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            eos = cfg.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            window = _sliding_window(cfg, family)
            rope = dict(cfg.get("rope_parameters") or {})  # transformers >= 5 layout
            theta = cfg.get("rope_theta", rope.pop("rope_theta", 10000.0))
            if hidden <= 0 or heads <= 0:
                raise ValueError("hidden_size and num_attention_heads must be positive")
            return cls(
                family=family,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=float(theta if theta is not None else 10000.0),
                rope_scaling=_parse_rope_scaling(cfg.get("rope_scaling") or rope or None),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(cfg.get("attention_bias", family == "qwen2")),
                qk_norm=family == "qwen3",
                sliding_window=int(window) if window else None,
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=eos_ids,
            )
        except KeyError as e:
            raise ModelLoadError(f"config.json lacks the required field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ModelLoadError(f"config.json has a malformed field: {e}") from None

    @classmethod
    def from_folder(cls, folder: Path) -> ModelConfig:
        """Read ``folder/config.json``."""
        path = folder / "config.json"
        if not path.is_file():
            raise ModelLoadError(f"{folder} has no config.json (is it a Hugging Face model folder?)")
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ModelLoadError(f"cannot read {path}: {e}") from None
        if not isinstance(data, dict):
            raise ModelLoadError(f"{path} is not a JSON object")
        return cls.from_hf_dict(data)


def _sliding_window(cfg: dict[str, Any], family: str) -> int | None:
    window = cfg.get("sliding_window")
    if family in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
        return None
    if not window:
        return None
    n_layers = int(cfg["num_hidden_layers"])
    layer_types = cfg.get("layer_types")
    mixed = (layer_types is not None and len(set(layer_types)) > 1) or (
        family in ("qwen2", "qwen3") and int(cfg.get("max_window_layers", 0)) < n_layers)
    if mixed:
        raise UnsupportedModelError(
            "sliding-window attention on only some layers (max_window_layers / layer_types) is "
            "not supported"
        )
    return int(window)


def _parse_rope_scaling(raw: dict[str, Any] | None) -> RopeScaling:
    if not raw:
        return RopeScaling()
    rope_type = str(raw.get("rope_type") or raw.get("type") or "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"rope_scaling type {rope_type!r} is not supported (supported: "
            f"{', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    return RopeScaling(
        rope_type=rope_type,
        factor=float(raw.get("factor", 1.0)),
        low_freq_factor=float(raw.get("low_freq_factor", 1.0)),
        high_freq_factor=float(raw.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(raw.get("original_max_position_embeddings", 8192)),
    )
