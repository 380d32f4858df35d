"""Give a CPU model's linears the GGUF's own Q4_1 / Q8_0 blocks for skinny (decode) batches.

A model loaded from a GGUF holds fp32 weights dequantized from its blocks. Those stay (prefill and
other large batches use them with BLAS), and each linear whose GGUF tensors are all Q4_1 or all
Q8_0 also gets a :class:`~grammarserve_kernels.quant.QuantWeight` of the same values, fused like
the fp32 weight (q/k/v and gate/up concatenated, llama's Q/K row permutation undone). Decode steps
are bound by the weight bytes they stream, and the blocks are 4-6x smaller.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from grammarserve_kernels.quant import pack_gguf_blocks, quant_kernel_available

from grammarserve.models.gguf_convert import read_gguf, unpermute_rows
from grammarserve.models.linear import Linear
from grammarserve.models.llama import LlamaModel

_KINDS = ("Q4_1", "Q8_0")
_FUSED = {  # our linear (per layer) -> the GGUF tensors whose rows it concatenates
    "self_attn.qkv_proj": ("attn_q", "attn_k", "attn_v"),
    "self_attn.o_proj": ("attn_output",),
    "mlp.gate_up_proj": ("ffn_gate", "ffn_up"),
    "mlp.down_proj": ("ffn_down",),
}


def attach_gguf_blocks(model: LlamaModel, gguf_path: Path) -> int:
    """Attach quantized blocks from ``gguf_path`` to ``model``'s linears; returns how many.

    Does nothing (returns 0) where the kernel cannot run here or the model is not fp32 on CPU.
    Linears whose tensors are of other types (F16, K-quants, ...) keep the fp32 path only.
    """
    first = next(model.parameters())
    if first.device.type != "cpu" or first.dtype != torch.float32 or not quant_kernel_available():
        return 0
    reader = read_gguf(gguf_path)
    tensors = {t.name: t for t in reader.tensors}
    arch = reader.fields["general.architecture"].contents()
    n_head = int(reader.fields[f"{arch}.attention.head_count"].contents())
    kv_field = reader.fields.get(f"{arch}.attention.head_count_kv")
    n_kv = int(kv_field.contents()) if kv_field is not None else n_head
    attached = 0
    for i, layer in enumerate(model.layers):
        for module_name, parts in _FUSED.items():
            blocks = []
            for part in parts:
                t = tensors.get(f"blk.{i}.{part}.weight")
                found = _raw_blocks(t)
                if found is None:
                    break
                kind, raw = found
                if arch in ("llama", "mistral") and part in ("attn_q", "attn_k"):
                    raw = unpermute_rows(raw, n_head if part == "attn_q" else n_kv)
                blocks.append((kind, raw))
            else:
                attached += _attach(layer.get_submodule(module_name), blocks)
    head = tensors.get("output.weight", tensors.get("token_embd.weight"))
    found = _raw_blocks(head)
    if found is not None:
        attached += _attach(model.lm_head, [found])
    return attached


def _raw_blocks(t: Any) -> tuple[str, np.ndarray] | None:
    if t is None or t.tensor_type.name not in _KINDS:
        return None
    return t.tensor_type.name, np.asarray(t.data)


def _attach(linear: torch.nn.Module, blocks: list[tuple[str, np.ndarray]]) -> int:
    kinds = {kind for kind, _ in blocks}
    if len(kinds) != 1 or not isinstance(linear, Linear):
        return 0
    q = pack_gguf_blocks(kinds.pop(), np.concatenate([raw for _, raw in blocks]))
    if q.shape != tuple(linear.weight.shape):
        return 0
    linear.quant = q
    return 1


def quant_summary(model: LlamaModel) -> dict[str, Any]:
    """How many linears carry blocks, and the bytes a skinny product streams with and without."""
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    blocks = [m.quant for m in linears if m.quant is not None]
    return {"linears": len(linears), "quantized": len(blocks),
            "fp32_bytes": sum(m.weight.numel() * 4 for m in linears),
            "quant_bytes": sum(q.nbytes() for q in blocks)
            + sum(m.weight.numel() * 4 for m in linears if m.quant is None)}
