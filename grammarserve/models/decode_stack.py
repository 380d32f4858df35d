"""Bind a loaded model's decoder layers to the one-call decode-step kernel
(:class:`grammarserve_kernels.decode_stack.DecodeStack`)."""

from __future__ import annotations

from grammarserve_kernels.decode_stack import (
    DecodeStack,
    StackDims,
    StackHead,
    StackLayer,
    StackLinear,
    stack_available,
)

from grammarserve.models.linear import Linear
from grammarserve.models.llama import DecoderLayer, LlamaModel


def bind_decode_stack(model: LlamaModel) -> DecodeStack | None:
    """The kernel bound to ``model``'s weights (with the final norm and the LM head where the
    head has int8-activation blocks), or None where it cannot run them: a linear without
    int8-activation blocks, q/k norms (Qwen3), a bias outside q/k/v, or no kernel here. A
    linear's row segments may mix kinds (a qkv of Q4_1 q/k rows and Q6_K v rows)."""
    cfg = model.config
    if cfg.qk_norm or not stack_available():
        return None
    layers: list[StackLayer] = []
    for layer in model.layers:
        assert isinstance(layer, DecoderLayer)
        attn, mlp = layer.self_attn, layer.mlp
        linears = [_bound(attn.qkv_proj), _bound(attn.o_proj), _bound(mlp.gate_up_proj),
                   _bound(mlp.down_proj)]
        if any(lin is None for lin in linears) or any(
                m.bias is not None for m in (attn.o_proj, mlp.gate_up_proj, mlp.down_proj)):
            return None
        qkv, o, gate_up, down = linears
        assert qkv is not None and o is not None and gate_up is not None and down is not None
        layers.append(StackLayer(layer.input_layernorm.weight.detach(),
                                 layer.post_attention_layernorm.weight.detach(),
                                 qkv, o, gate_up, down))
    dims = StackDims(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                     cfg.intermediate_size, cfg.rms_norm_eps)
    head_linear = _bound(model.lm_head)
    head = (StackHead(model.norm.weight.detach(), head_linear)
            if head_linear is not None and head_linear.bias is None else None)
    try:
        return DecodeStack(dims, layers, head)
    except ValueError:  # a head size or grouping the kernel does not handle
        return None


def _bound(linear: Linear) -> StackLinear | None:
    """``linear``'s row segments (mixed kinds allowed), or None without int8-activation blocks."""
    if not linear.quant_x16:
        return None
    bias = linear.bias.detach() if linear.bias is not None else None
    return StackLinear(tuple(linear.quant_x16), bias)
