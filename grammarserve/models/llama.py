"""Llama-family decoder (Llama, SmolLM, Mistral, Qwen2 with qkv bias, Qwen3 with q/k RMSNorm).

Runs ragged batches: all new tokens of all requests are one flat ``[T, hidden]`` tensor, so the
projections and the MLP are single matmuls; only attention looks at request boundaries, through the
attention backend. Q/K/V and gate/up projections are fused at load time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from grammarserve_kernels.decode_stack import DecodeStack
from torch import nn

from grammarserve.attention.backend import AttentionBackend
from grammarserve.attention.forward_batch import ForwardBatch
from grammarserve.models.config import ModelConfig
from grammarserve.models.linear import Linear
from grammarserve.models.rope import apply_rope, rope_cos_sin, rope_inv_freq


class RMSNorm(nn.Module):
    """RMS normalisation computed in fp32, as Hugging Face does."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused op; bit-identical to the steps below in fp32
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size,
                                  bias=cfg.attention_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attn: AttentionBackend) -> torch.Tensor:
        qkv = self.qkv_proj(x).contiguous().view(-1, self.num_heads + 2 * self.num_kv_heads,
                                                 self.head_dim)
        q, k, v = qkv.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=1)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = apply_rope(self.q_norm(q), cos, sin), apply_rope(self.k_norm(k), cos, sin)
        else:  # q and k rotated together: half the small ops
            q, k = apply_rope(qkv[:, :self.num_heads + self.num_kv_heads], cos, sin).split(
                [self.num_heads, self.num_kv_heads], dim=1)
        o = attn.forward(self.layer, q, k, v)
        return self.o_proj(o.reshape(-1, self.q_size))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.inter = cfg.intermediate_size
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split([self.inter, self.inter], dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attn: AttentionBackend) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, attn)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    """Decoder with an LM head. ``forward`` returns fp32 logits for ``batch.logit_rows``."""

    inv_freq: torch.Tensor
    # The decoder layers bound to the one-call decode kernel (models/decode_stack.py), set with
    # the quantized blocks; decode steps the attention backend offers run through it.
    decode_stack: DecodeStack | None = None
    #: How the linears multiply prefill-sized batches (``quant_weights.set_prefill_matmul``);
    #: "bf16" also lets long prompts attend in bf16 (``attention/backend.py``).
    prefill_matmul: str = "int8x2"

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer(
            "inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling),
            persistent=False,
        )

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        attn.prepare(batch)
        h = self.embed_tokens(batch.input_ids)
        cos, sin = rope_cos_sin(batch.positions, self.inv_freq, h.dtype)
        kv = attn.stack_kv() if self.decode_stack is not None and h.dtype == torch.float32 \
            else None
        if kv is not None and self.decode_stack is not None:  # a decode step: one kernel call
            logits = self.decode_stack.run(h, cos, sin, kv, batch.logit_rows)
            if logits is not None:  # the final norm and the LM head ran in the same call
                return logits
        else:
            for layer in self.layers:
                h = layer(h, cos, sin, attn)
        h = self.norm(h[batch.logit_rows])
        return self.lm_head(h).float().contiguous()
