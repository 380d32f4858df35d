"""Random-weight GGUF files of real model shapes, with each family's real tokenizer and chat template.

``make_gguf("qwen3-0.6b", out)`` writes a GGUF that loads like the published model's own file:
llama.cpp's tensor names and metadata keys (Q/K rows permuted for the ``llama`` architecture, as
llama.cpp's converter does; Llama 3's rope scaling as a ``rope_freqs.weight`` tensor), linears
quantized to Q4_1 and the token embedding to Q8_0 like the embedded SmolLM2 file, norms and biases
F32, the family's ``tokenizer.ggml.*`` metadata (see ``vocab_files``) and its chat template. Weights
are seeded and scaled so that logits have clear margins (``random_models``'s scales: embedding std
0.5, projections 1/sqrt(fan-in), norm gains 1 +- 0.1), so greedy comparisons compare real choices.

Files are cached by (shape, seed, qtype, :data:`GENERATOR_VERSION`): a second call returns at once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
import vocab_files
from gguf import GGMLQuantizationType, GGUFValueType
from gguf.quants import quantize
from kquants import QK_K, QUANTIZERS, q4_k_m_type, q5_k_m_type

GENERATOR_VERSION = 1
ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "tests" / "data" / "templates"
EMBED_STD = 0.5
BIAS_STD = 0.1
QTYPES = ("Q4_1", "Q8_0", "F16", "F32", "Q4_K_M", "Q5_K_M")
#: Where a row is not whole K-quant super-blocks, llama.cpp quantizes it to these instead.
_K_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


@dataclass(frozen=True)
class Llama3Rope:
    """Llama 3.1's ``rope_scaling`` (``rope_type: llama3``)."""

    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelShape:
    """One model's architecture, as its config.json states it, plus its tokenizer and template.

    ``tokenizer`` names a key of ``vocab_files.BASE_VOCAB``; ``chat_template`` a file in
    ``tests/data/templates`` (``None``: the vocabulary file's own template).
    """

    arch: str  # GGUF general.architecture: llama, qwen2, qwen3
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qkv_bias: bool
    qk_norm: bool
    rope_theta: float
    rope_scaling: Llama3Rope | None
    context_length: int
    rms_eps: float
    tokenizer: str
    chat_template: str | None

    @property
    def num_params(self) -> int:
        """Parameters, counting a tied embedding once."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = self.hidden * (q + 2 * kv) + q * self.hidden
        attn += (q + 2 * kv) if self.qkv_bias else 0
        attn += 2 * self.head_dim if self.qk_norm else 0
        layer = attn + 3 * self.hidden * self.intermediate + 2 * self.hidden
        embed = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * layer + embed + self.hidden


_SMOL = {"arch": "llama", "vocab": 49152, "tied": True, "qkv_bias": False, "qk_norm": False,
         "rope_scaling": None, "context_length": 8192, "rms_eps": 1e-5, "tokenizer": "smollm2",
         "chat_template": None}
_QWEN = {"arch": "qwen2", "vocab": 151936, "tied": True, "qkv_bias": True, "qk_norm": False,
         "rope_theta": 1e6, "rope_scaling": None, "context_length": 32768, "rms_eps": 1e-6,
         "tokenizer": "qwen2.5", "chat_template": "Qwen-Qwen2.5-7B-Instruct.jinja"}
# Numbers from each model's published config.json on the Hugging Face Hub
# (HuggingFaceTB/SmolLM2-*-Instruct, Qwen/Qwen2.5-0.5B-Instruct, Qwen/Qwen3-0.6B,
# meta-llama/Llama-3.2-1B-Instruct). The *-tiny shapes keep a family's tokenizer, template and
# architecture features at a few MB of layers, for fast parity tests.
SHAPES: dict[str, ModelShape] = {
    "smollm2-135m": ModelShape(layers=30, hidden=576, intermediate=1536, heads=9, kv_heads=3,
                               head_dim=64, rope_theta=1e5, **_SMOL),
    "smollm2-360m": ModelShape(layers=32, hidden=960, intermediate=2560, heads=15, kv_heads=5,
                               head_dim=64, rope_theta=1e5, **_SMOL),
    "smollm2-1.7b": ModelShape(layers=24, hidden=2048, intermediate=8192, heads=32, kv_heads=32,
                               head_dim=64, rope_theta=1.3e5, **_SMOL),
    "qwen2.5-0.5b": ModelShape(layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2,
                               head_dim=64, **_QWEN),
    "qwen3-0.6b": ModelShape(**{**_QWEN, "arch": "qwen3", "qkv_bias": False, "qk_norm": True,
                                "context_length": 40960, "tokenizer": "qwen3",
                                "chat_template": "Qwen-Qwen3-0.6B.jinja"},
                             layers=28, hidden=1024, intermediate=3072, heads=16, kv_heads=8,
                             head_dim=128),
    "llama-3.2-1b": ModelShape(arch="llama", layers=16, hidden=2048, intermediate=8192, heads=32,
                               kv_heads=8, head_dim=64, vocab=128256, tied=True, qkv_bias=False,
                               qk_norm=False, rope_theta=5e5, rope_scaling=Llama3Rope(32.0),
                               context_length=131072, rms_eps=1e-5, tokenizer="llama3.1",
                               chat_template="meta-llama-Llama-3.2-3B-Instruct.jinja"),
    "llama-3.1-8b": ModelShape(arch="llama", layers=32, hidden=4096, intermediate=14336,
                               heads=32, kv_heads=8, head_dim=128, vocab=128256, tied=False,
                               qkv_bias=False, qk_norm=False, rope_theta=5e5,
                               rope_scaling=Llama3Rope(8.0), context_length=131072, rms_eps=1e-5,
                               tokenizer="llama3.1",
                               chat_template="meta-llama-Llama-3.1-8B-Instruct.jinja"),
}
_TINY = {"layers": 2, "hidden": 128, "intermediate": 256, "heads": 4, "kv_heads": 2, "head_dim": 32}
# NOTE: transformers' GGUF loader reads no head_dim (attention.key_length) and Qwen3Config's default
# is 128, so the Qwen3 stand-in keeps head_dim 128 for parity tests.
_TINY_QWEN3 = {**_TINY, "heads": 2, "kv_heads": 1, "head_dim": 128}
for _base in ("smollm2-135m", "qwen2.5-0.5b", "qwen3-0.6b", "llama-3.2-1b"):
    SHAPES[_base.split("-")[0] + "-tiny"] = ModelShape(**{
        **asdict(SHAPES[_base]), **(_TINY_QWEN3 if _base.startswith("qwen3") else _TINY),
        "rope_scaling": SHAPES[_base].rope_scaling})

# A SmolLM2 stand-in whose rows are whole K-quant super-blocks (256 values) and whose 8 layers let
# Q4_K_M's mix vary (Q6_K attn_v / ffn_down in layers 0, 3, 6, 7), for the K-quant loader tests.
SHAPES["smollm2-ktiny"] = ModelShape(**{**asdict(SHAPES["smollm2-135m"]), "layers": 8,
                                        "hidden": 256, "intermediate": 512, "heads": 4,
                                        "kv_heads": 2, "head_dim": 64, "rope_scaling": None})

# The instruct tokenizers' special ids (tokenizer_config.json of the same models): end of turn,
# padding, and whether the tokenizer adds BOS (llama.cpp's add_bos_token).
_QWEN_IDS: dict[str, int | bool] = {"eos_token_id": 151645, "padding_token_id": 151643,
                                    "bos_token_id": 151643, "add_bos_token": False}
_SPECIAL_IDS: dict[str, dict[str, int | bool]] = {
    "qwen2.5": _QWEN_IDS, "qwen3": _QWEN_IDS,
    "llama3.1": {"eos_token_id": 128009, "bos_token_id": 128000, "add_bos_token": True},
}


def default_dir() -> Path:
    """The cache folder for generated files: ``<cache root>/model_shapes`` (see ``vocab_files``)."""
    return vocab_files.cache_root() / "model_shapes"


def cached_path(shape: str, out: Path, seed: int = 0, qtype: str = "Q4_1") -> Path:
    """Where :func:`make_gguf` writes: ``out`` itself when it ends in ``.gguf``, else a file
    named by the cache key inside the folder ``out``."""
    if out.suffix == ".gguf":
        return out
    return out / f"{shape}-s{seed}-{qtype.lower()}-v{GENERATOR_VERSION}.gguf"


def make_gguf(shape: str, out: Path, *, seed: int = 0, qtype: str = "Q4_1") -> Path:
    """Write (or find cached) a random-weight GGUF of :data:`SHAPES` ``[shape]``; returns its path.

    ``out`` is a folder (the file is named by shape, seed, qtype and generator version) or a
    ``.gguf`` path (a ``.key`` file beside it records what it holds). ``qtype`` is the linears'
    type (``Q4_1``, ``Q8_0``, ``F16``, ``F32``); with Q4_1 the embedding is Q8_0, else ``qtype``.
    ``Q4_K_M`` is llama.cpp's mix of Q4_K and Q6_K (``kquants.q4_k_m_type``), quantized by the
    plain min/max quantizers of ``kquants.py``.
    Deterministic: the same arguments give the same bytes.
    """
    if shape not in SHAPES:
        raise KeyError(f"unknown shape {shape!r} (known: {', '.join(SHAPES)})")
    if qtype not in QTYPES:
        raise ValueError(f"qtype must be one of {QTYPES}, not {qtype!r}")
    path = cached_path(shape, out, seed, qtype)
    key = json.dumps({"shape": asdict(SHAPES[shape]), "seed": seed, "qtype": qtype,
                      "version": GENERATOR_VERSION}, sort_keys=True)
    stamp = path.with_suffix(".key")
    if path.is_file() and stamp.is_file() and stamp.read_text() == key:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    _write(SHAPES[shape], part, seed, qtype)
    part.replace(path)
    stamp.write_text(key)
    return path


def _write(s: ModelShape, path: Path, seed: int, qtype: str) -> None:
    writer = gguf.GGUFWriter(str(path), s.arch)
    writer.add_name(f"random {s.arch} seed {seed}")
    writer.add_block_count(s.layers)
    writer.add_context_length(s.context_length)
    writer.add_embedding_length(s.hidden)
    writer.add_feed_forward_length(s.intermediate)
    writer.add_head_count(s.heads)
    writer.add_head_count_kv(s.kv_heads)
    writer.add_key_length(s.head_dim)
    writer.add_value_length(s.head_dim)
    writer.add_rope_dimension_count(s.head_dim)
    writer.add_rope_freq_base(s.rope_theta)
    writer.add_layer_norm_rms_eps(s.rms_eps)
    writer.add_vocab_size(s.vocab)
    writer.add_file_type(_FILE_TYPES[qtype])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_tokenizer(writer, s)
    for name, arr in _tensors(s, seed):
        _add_tensor(writer, name, arr, qtype, s)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


_FILE_TYPES = {"Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
               "F16": gguf.LlamaFileType.MOSTLY_F16, "F32": gguf.LlamaFileType.ALL_F32,
               "Q4_K_M": gguf.LlamaFileType.MOSTLY_Q4_K_M,
               "Q5_K_M": gguf.LlamaFileType.MOSTLY_Q5_K_M}


def _add_tensor(writer: gguf.GGUFWriter, name: str, arr: np.ndarray, qtype: str,
                s: ModelShape) -> None:
    if arr.ndim == 1 or name == "rope_freqs.weight":
        writer.add_tensor(name, arr.astype(np.float32))
        return
    kind = "Q8_0" if qtype == "Q4_1" and name == "token_embd.weight" else qtype
    if kind in ("Q4_K_M", "Q5_K_M"):
        kind = (q4_k_m_type if kind == "Q4_K_M" else q5_k_m_type)(name, s.layers, s.tied)
        kind = kind if arr.shape[1] % QK_K == 0 else _K_FALLBACK[kind]
    if kind in QUANTIZERS:
        writer.add_tensor(name, QUANTIZERS[kind](arr),
                          raw_dtype=GGMLQuantizationType[kind])
    elif kind == "F32":
        writer.add_tensor(name, arr)
    elif kind == "F16":
        writer.add_tensor(name, arr.astype(np.float16))
    else:
        qt = GGMLQuantizationType[kind]
        writer.add_tensor(name, quantize(arr, qt), raw_dtype=qt)


def _tensors(s: ModelShape, seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """GGUF-named fp32 arrays, drawn in a fixed order from one seeded generator, one at a time
    (a 1.7B shape never holds all its fp32 weights at once)."""
    g = torch.Generator().manual_seed(seed)

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return (torch.randn(shape, generator=g) * std).numpy()

    def gain(n: int) -> np.ndarray:
        return (1.0 + 0.1 * torch.randn(n, generator=g)).numpy()

    def linear(rows: int, cols: int) -> np.ndarray:
        return normal((rows, cols), cols ** -0.5)

    h, q, kv = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
    yield "token_embd.weight", normal((s.vocab, h), EMBED_STD)
    if s.rope_scaling is not None:
        yield "rope_freqs.weight", llama3_rope_factors(s.head_dim, s.rope_theta, s.rope_scaling)
    for i in range(s.layers):
        p = f"blk.{i}."
        # NOTE: draw order (Q, K, then the norm) is part of the files' bytes: keep it
        wq, wk = linear(q, h), linear(kv, h)
        if s.arch == "llama":  # NOTE: llama.cpp stores llama-arch Q/K rows permuted for its RoPE
            wq, wk = permute_rows(wq, s.heads), permute_rows(wk, s.kv_heads)
        yield p + "attn_norm.weight", gain(h)
        yield p + "attn_q.weight", wq
        yield p + "attn_k.weight", wk
        yield p + "attn_v.weight", linear(kv, h)
        if s.qkv_bias:
            for n, m in (("q", q), ("k", kv), ("v", kv)):
                yield p + f"attn_{n}.bias", normal((m,), BIAS_STD)
        if s.qk_norm:
            yield p + "attn_q_norm.weight", gain(s.head_dim)
            yield p + "attn_k_norm.weight", gain(s.head_dim)
        yield p + "attn_output.weight", linear(h, q)
        yield p + "ffn_norm.weight", gain(h)
        yield p + "ffn_gate.weight", linear(s.intermediate, h)
        yield p + "ffn_up.weight", linear(s.intermediate, h)
        yield p + "ffn_down.weight", linear(h, s.intermediate)
    yield "output_norm.weight", gain(h)
    if not s.tied:
        yield "output.weight", normal((s.vocab, h), EMBED_STD)


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Q/K row permutation (the inverse of ``gguf_convert.unpermute_rows``)."""
    rows = w.shape[0]
    return (w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama3_rope_factors(head_dim: int, theta: float, r: Llama3Rope) -> np.ndarray:
    """``rope_freqs.weight`` as llama.cpp's converter writes it: per frequency, how much Llama 3's
    scaling divides it by (1 for high frequencies, ``factor`` for low ones, smooth between)."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    low_wavelen = r.original_max_position_embeddings / r.low_freq_factor
    high_wavelen = r.original_max_position_embeddings / r.high_freq_factor
    factors = []
    for freq in inv_freq:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(r.factor)
        else:
            smooth = ((r.original_max_position_embeddings / wavelen - r.low_freq_factor)
                      / (r.high_freq_factor - r.low_freq_factor))
            factors.append(1.0 / ((1 - smooth) / r.factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def _add_tokenizer(writer: gguf.GGUFWriter, s: ModelShape) -> None:
    """Copy ``tokenizer.*`` from the family's vocabulary file, patch in its added tokens and
    special ids, and set the chat template."""
    reader = gguf.GGUFReader(str(vocab_files.vocab_gguf(vocab_files.BASE_VOCAB[s.tokenizer])))
    fields = {k: f for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    tokens = list(fields["tokenizer.ggml.tokens"].contents())
    types = list(fields["tokenizer.ggml.token_type"].contents())
    if len(tokens) != s.vocab:
        raise ValueError(f"{s.tokenizer} has {len(tokens)} tokens; the shape wants {s.vocab}")
    for added in vocab_files.ADDED_TOKENS.get(s.tokenizer, ()):
        tokens[added.token_id] = added.text
        types[added.token_id] = int(added.kind)
    kv = {k: (f.contents(), f.types[0], f.types[1] if f.types[0] == GGUFValueType.ARRAY else None)
          for k, f in fields.items() if k != "tokenizer.chat_template"}
    kv["tokenizer.ggml.tokens"] = (tokens, *kv["tokenizer.ggml.tokens"][1:])
    kv["tokenizer.ggml.token_type"] = (types, *kv["tokenizer.ggml.token_type"][1:])
    for key, value in _SPECIAL_IDS.get(s.tokenizer, {}).items():
        if isinstance(value, bool):
            kv[f"tokenizer.ggml.{key}"] = (value, GGUFValueType.BOOL, None)
        else:
            kv[f"tokenizer.ggml.{key}"] = (value, GGUFValueType.UINT32, None)
    for key, (value, vtype, sub) in kv.items():
        writer.add_key_value(key, value, vtype, sub)
    if s.chat_template is not None:
        template = (TEMPLATES / s.chat_template).read_text()
    else:
        template = str(fields["tokenizer.chat_template"].contents())
    writer.add_key_value("tokenizer.chat_template", template, GGUFValueType.STRING)
