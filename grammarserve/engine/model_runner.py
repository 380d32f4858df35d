"""Builds the ragged batch from scheduled work and runs the model on it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grammarserve.attention.backend import AttentionBackend, TorchSDPABackend
from grammarserve.attention.forward_batch import ForwardBatch
from grammarserve.attention.kv_pool import KVPool, ReqToTokenPool
from grammarserve.attention.staging import stage_int64
from grammarserve.attention.varlen import VarlenBackend
from grammarserve.config import EngineConfig
from grammarserve.engine.cuda_graphs import DecodeGraphs
from grammarserve.models.llama import LlamaModel


@dataclass(frozen=True)
class BatchEntry:
    """One request's share of a forward: ``token_ids`` are new tokens at positions
    ``prefix_len ..``; their KV slots are already recorded in the request's table row. The
    logits of the last ``num_logits`` of them are returned (a speculative draft's positions and
    the one after it; otherwise the last token's alone)."""

    req_pool_idx: int
    prefix_len: int
    token_ids: list[int]
    seq_id: int = -1  # stable request identity across steps; -1 = unknown (never reused)
    num_logits: int = 1


class ModelRunner:
    """Owns the model, the KV pool and the request-to-token table of one device."""

    def __init__(self, model: LlamaModel, pool: KVPool, req_to_token: ReqToTokenPool,
                 attn: AttentionBackend | None = None, graphs: DecodeGraphs | None = None) -> None:
        self.model = model
        self.graphs = graphs
        self.pool = pool
        self.req_to_token = req_to_token
        self.device = pool.device
        self.attn = attn or TorchSDPABackend(pool, req_to_token, model.config.sliding_window)
        self.vocab_size = model.config.vocab_size

    @classmethod
    def build(cls, model: LlamaModel, config: EngineConfig, capacity: int,
              max_context: int, *, mirror_tokens: int) -> ModelRunner:
        """The runner for ``config``: a KV pool of ``capacity`` tokens, a table of
        ``max_num_reqs`` rows of ``max_context``, the configured attention backend (the torch
        one with a decode mirror of at most ``mirror_tokens``, 0: none), and CUDA graphs where
        the device and the model allow them."""
        mc, device = model.config, config.torch_device
        pool = KVPool(capacity=capacity, num_layers=mc.num_layers, num_kv_heads=mc.num_kv_heads,
                      head_dim=mc.head_dim, dtype=config.torch_kv_dtype, device=device)
        table = ReqToTokenPool(max_reqs=config.max_num_reqs, max_context=max_context,
                               device=device)
        attn: AttentionBackend
        if config.attention_backend == "varlen":
            attn = VarlenBackend(pool, table, mc.sliding_window)
        else:
            attn = TorchSDPABackend(
                pool, table, mc.sliding_window,
                mirror_tokens=mirror_tokens,
                decode_kernel=config.decode_attention_kernel,
                decode_stack=config.decode_stack_kernel,
                prefill_dtype=torch.bfloat16 if model.prefill_matmul == "bf16" else None)
        graphs = None
        if config.cuda_graphs and device.type == "cuda" and DecodeGraphs.supports(model):
            graphs = DecodeGraphs(model, pool, table, config.max_num_reqs)
        return cls(model, pool, table, attn, graphs)

    def entry_problem(self, e: BatchEntry) -> str | None:
        """What makes ``e`` unfit for a batch (None if nothing): the engine checks each entry
        first, so a broken request fails alone instead of failing the forward of all."""
        n = len(e.token_ids)
        if n == 0:
            return "a batch entry must bring at least one new token"
        if not 1 <= e.num_logits <= n:
            return f"a batch entry of {n} tokens cannot return {e.num_logits} logit rows"
        if min(e.token_ids) < 0 or max(e.token_ids) >= self.vocab_size:
            return f"a batch entry's token ids must be in [0, {self.vocab_size})"
        if e.prefix_len < 0 or e.prefix_len + n > self.req_to_token.max_context:
            return (f"a batch entry's positions {e.prefix_len}..{e.prefix_len + n - 1} are "
                    f"outside the context of {self.req_to_token.max_context}")
        return None

    def build_batch(self, entries: list[BatchEntry]) -> ForwardBatch:
        """Flatten entries into one ragged :class:`ForwardBatch` (logits: the last
        ``num_logits`` rows of each).

        The token ids, positions and table rows go to the device in one copy (pinned and
        asynchronous on CUDA); the new tokens' KV slots are read from the table there."""
        ids: list[int] = []
        positions: list[int] = []
        owners: list[int] = []
        logit_rows: list[int] = []
        for e in entries:
            n = len(e.token_ids)
            problem = self.entry_problem(e)
            if problem is not None:
                raise ValueError(problem)
            ids.extend(e.token_ids)
            positions.extend(range(e.prefix_len, e.prefix_len + n))
            owners.extend([e.req_pool_idx] * n)
            logit_rows.extend(range(len(ids) - e.num_logits, len(ids)))
        ids_t, pos_t, owner_t, logit_t = stage_int64([ids, positions, owners, logit_rows],
                                                     self.device)
        return ForwardBatch(
            input_ids=ids_t,
            positions=pos_t,
            out_cache_loc=self.req_to_token.table[owner_t, pos_t],
            req_pool_indices=[e.req_pool_idx for e in entries],
            prefix_lens=[e.prefix_len for e in entries],
            extend_lens=[len(e.token_ids) for e in entries],
            logit_rows=logit_t,
            seq_ids=[e.seq_id if e.seq_id >= 0 else -1 - i for i, e in enumerate(entries)],
        )

    def forward(self, entries: list[BatchEntry]) -> torch.Tensor:
        """Run the entries; returns fp32 logits ``[sum of num_logits, vocab]``: each entry's
        last ``num_logits`` tokens in order (a decode step through its CUDA graph when the
        runner has them)."""
        if self.graphs is not None and self.graphs.usable(entries):
            logits = self.graphs.run(entries)
            if logits is not None:
                return logits
        return self.model(self.build_batch(entries), self.attn)
