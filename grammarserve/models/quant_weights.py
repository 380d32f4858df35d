"""Give a CPU model's linears the GGUF's own quantized blocks for skinny (decode) batches.

A model loaded from a GGUF holds fp32 weights dequantized from its blocks. Those stay (prefill and
other large batches use them with BLAS), and each linear whose GGUF tensors all pack into one
kernel layout (Q4_1, or Q4_K repacked losslessly into it; Q8_0) also gets a
:class:`~grammarserve_kernels.quant.QuantWeight` of the same values, fused like the fp32 weight
(q/k/v and gate/up concatenated, llama's Q/K row permutation undone). Decode steps are bound by
the weight bytes they stream, and the blocks are 4-6x smaller. With int8 activations (the
default) each linear also holds the same blocks interleaved by 16 rows for the integer kernel
(``kernels/quant_q8_cpu.cpp``). Other types (Q5_K, Q6_K, F16, ...) keep the fp32 path only.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from grammarserve_kernels.quant import (
    PACKED_TYPES,
    QuantWeight,
    pack_gguf_blocks,
    quant_kernel_available,
)
from grammarserve_kernels.quant_q8 import cpu_isa, pack_x16

from grammarserve.models.decode_stack import bind_decode_stack
from grammarserve.models.gguf_convert import read_gguf, unpermute_rows
from grammarserve.models.linear import Linear
from grammarserve.models.llama import LlamaModel

_CACHE_FILE = Path("blocks") / "gguf-blocks-v2.safetensors"  # not globbed with the weights
_FUSED = {  # our linear (per layer) -> the GGUF tensors whose rows it concatenates
    "self_attn.qkv_proj": ("attn_q", "attn_k", "attn_v"),
    "self_attn.o_proj": ("attn_output",),
    "mlp.gate_up_proj": ("ffn_gate", "ffn_up"),
    "mlp.down_proj": ("ffn_down",),
}


def attach_gguf_blocks(model: LlamaModel, gguf_path: Path, cache: Path | None = None,
                       activations: str = "int8x2") -> int:
    """Attach quantized blocks from ``gguf_path`` to ``model``'s linears; returns how many.

    ``activations`` is passed to :func:`set_quant_activations`.

    Does nothing (returns 0) where the kernel cannot run here or the model is not fp32 on CPU.
    Linears whose tensors are of other types (F16, K-quants, ...) keep the fp32 path only.
    ``cache`` (the converted model folder) keeps the packed blocks in ``blocks/``: parsing the
    GGUF's metadata (its whole vocabulary) takes seconds, reading the cache does not.
    """
    first = next(model.parameters())
    if first.device.type != "cpu" or first.dtype != torch.float32 or not quant_kernel_available():
        return 0
    file = cache / _CACHE_FILE if cache is not None else None
    packed = _read_cache(file) if file is not None else None
    if packed is None:
        packed = _pack_from_gguf(gguf_path, len(model.layers))
        if file is not None:
            _write_cache(file, packed)
    attached = 0
    for name, q in packed.items():
        linear = model.get_submodule(name)
        if isinstance(linear, Linear) and q.shape == tuple(linear.weight.shape):
            linear.quant = q
            attached += 1
    set_quant_activations(model, activations)
    return attached


ACTIVATIONS = {"int8x2": 2, "int8": 1, "fp32": 0}  # -> int8 levels (0: the fp32 kernel)


def set_quant_activations(model: LlamaModel, activations: str) -> str:
    """Run ``model``'s quantized linears with ``activations``: ``"int8x2"`` (int8 plus the int8
    residual: ~2e-5 relative error per product), ``"int8"`` (llama.cpp's Q8 activations, ~5e-3)
    or ``"fp32"`` (exact). Returns the mode in use: ``"fp32"`` where the int8 kernel cannot be
    built here."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {', '.join(ACTIVATIONS)}, got "
                         f"{activations!r}")
    levels = ACTIVATIONS[activations] if cpu_isa() is not None else 0
    for module in model.modules():
        if isinstance(module, Linear) and module.quant is not None:
            module.quant_x16 = pack_x16(module.quant, levels=levels) if levels else None
    model.decode_stack = bind_decode_stack(model)
    return activations if levels else "fp32"


def _pack_from_gguf(gguf_path: Path, num_layers: int) -> dict[str, QuantWeight]:
    """Our linear name -> its blocks, fused and unpermuted like the fp32 weights."""
    reader = read_gguf(gguf_path)
    tensors = {t.name: t for t in reader.tensors}
    arch = reader.fields["general.architecture"].contents()
    n_head = int(reader.fields[f"{arch}.attention.head_count"].contents())
    kv_field = reader.fields.get(f"{arch}.attention.head_count_kv")
    n_kv = int(kv_field.contents()) if kv_field is not None else n_head
    packed: dict[str, QuantWeight] = {}
    for i in range(num_layers):
        for module_name, parts in _FUSED.items():
            blocks = []
            for part in parts:
                found = _raw_blocks(tensors.get(f"blk.{i}.{part}.weight"))
                if found is None:
                    break
                kind, raw = found
                if arch in ("llama", "mistral") and part in ("attn_q", "attn_k"):
                    raw = unpermute_rows(raw, n_head if part == "attn_q" else n_kv)
                blocks.append(pack_gguf_blocks(kind, raw))
            else:
                if len({q.kind for q in blocks}) == 1:  # Q4_K and Q4_1 parts share a layout
                    packed[f"layers.{i}.{module_name}"] = _concat_rows(blocks)
    found = _raw_blocks(tensors.get("output.weight", tensors.get("token_embd.weight")))
    if found is not None:
        packed["lm_head"] = pack_gguf_blocks(*found)
    return packed


def _concat_rows(parts: list[QuantWeight]) -> QuantWeight:
    if len(parts) == 1:
        return parts[0]
    return QuantWeight(parts[0].kind, *(torch.cat([getattr(q, f) for q in parts])
                                        for f in ("qs", "d", "m")))


def _raw_blocks(t: Any) -> tuple[str, np.ndarray] | None:
    if t is None or t.tensor_type.name not in PACKED_TYPES:
        return None
    return t.tensor_type.name, np.asarray(t.data)


def _read_cache(file: Path) -> dict[str, QuantWeight] | None:
    from safetensors import SafetensorError, safe_open

    if not file.is_file():
        return None
    try:
        with safe_open(str(file), framework="pt") as f:
            kinds = json.loads((f.metadata() or {})["kinds"])
            return {name: QuantWeight(kind, f.get_tensor(f"{name}.qs"), f.get_tensor(f"{name}.d"),
                                      f.get_tensor(f"{name}.m"))
                    for name, kind in kinds.items()}
    except (SafetensorError, OSError, KeyError, ValueError):
        return None  # unreadable: rebuilt from the GGUF (and rewritten)


def _write_cache(file: Path, packed: dict[str, QuantWeight]) -> None:
    from safetensors.torch import save_file

    tensors = {f"{name}.{part}": getattr(q, part).contiguous()
               for name, q in packed.items() for part in ("qs", "d", "m")}
    file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".tmp", dir=file.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={"kinds": json.dumps({n: q.kind for n, q in
                                                                packed.items()})})
        os.replace(tmp, file)
    except OSError:
        pass  # a read-only cache only costs the next start the GGUF parse
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)

