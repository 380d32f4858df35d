"""CUDA graphs for decode steps: one captured forward per padded batch-size bucket.

A decode step (every request one new token) of a small model on a large GPU is bound by the
host: ~40 kernel launches per layer. Captured once per bucket, a step becomes one graph replay.
The captured forward reads everything from static buffers (token ids, positions, table rows,
sequence lengths, a live flag), which each step refills with one pinned host->device copy;
attention reads K/V in place (:class:`~grammarserve.attention.paged_decode.PagedDecodeBackend`),
so no shape depends on the context. A batch is padded up to its bucket with rows that write
their K/V to the padding slot 0 and attend one token: harmless, and their logits are dropped.

On a CPU the same static forward runs eagerly (``capture=False``): what the CPU tests check.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from grammarserve.attention.forward_batch import ForwardBatch
from grammarserve.attention.kv_pool import KVPool, ReqToTokenPool
from grammarserve.attention.paged_decode import PagedDecodeBackend
from grammarserve.models.llama import LlamaModel

if TYPE_CHECKING:
    from grammarserve.engine.model_runner import BatchEntry

log = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)
_IDS, _POS, _ROWS, _SEQ, _LIVE = range(5)


class DecodeGraphs:
    """Captured decode forwards of ``model`` for batches of up to ``max_batch`` requests."""

    def __init__(self, model: LlamaModel, pool: KVPool, req_to_token: ReqToTokenPool,
                 max_batch: int, *, capture: bool = True) -> None:
        self.model = model
        self.table = req_to_token
        self.buckets = [b for b in BUCKETS if b < max_batch] + [
            next((b for b in BUCKETS if b >= max_batch), max_batch)]
        self.max_batch = self.buckets[-1]
        self.device = pool.device
        self.capture = capture and self.device.type == "cuda"
        self.static = torch.zeros(5, self.max_batch, dtype=torch.int64, device=self.device)
        self.static[_SEQ] = 1
        self.attn = PagedDecodeBackend(pool, req_to_token)
        self._arange = torch.arange(self.max_batch, device=self.device)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._mempool = torch.cuda.graph_pool_handle() if self.capture else None
        self.failed: str | None = None  # why a capture failed (graphs are then off)

    def usable(self, entries: Sequence[BatchEntry]) -> bool:
        """A decode step of at most ``max_batch`` requests."""
        return (self.failed is None and 0 < len(entries) <= self.max_batch
                and all(len(e.token_ids) == 1 for e in entries))

    @staticmethod
    def supports(model: LlamaModel) -> bool:
        """The paged decode kernel's limits: no sliding window, a power-of-two head_dim."""
        d = model.config.head_dim
        return model.config.sliding_window is None and d >= 16 and d & (d - 1) == 0

    def bucket(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)

    def run(self, entries: Sequence[BatchEntry]) -> torch.Tensor | None:
        """fp32 logits ``[len(entries), vocab]`` of a decode step (see :meth:`usable`); None
        when a capture failed (the caller then runs the step eagerly)."""
        n = len(entries)
        bs = self.bucket(n)
        pad = bs - n
        host = torch.tensor([[e.token_ids[0] for e in entries] + [0] * pad,
                             [e.prefix_len for e in entries] + [0] * pad,
                             [e.req_pool_idx for e in entries] + [entries[0].req_pool_idx] * pad,
                             [e.prefix_len + 1 for e in entries] + [1] * pad,
                             [1] * n + [0] * pad], dtype=torch.int64)
        if self.device.type == "cuda":
            host = host.pin_memory()
        self.static[:, :bs].copy_(host, non_blocking=True)
        if not self.capture:
            return self._forward(bs)[:n]
        if bs not in self._graphs:
            try:
                self._graphs[bs] = self._capture(bs)
            except Exception as e:  # noqa: BLE001 - the engine goes on without graphs
                self.failed = f"{type(e).__name__}: {e}"
                log.warning("CUDA graph capture failed; decoding eagerly from now on: %s",
                            self.failed)
                torch.cuda.synchronize(self.device)
                return None
        graph, logits = self._graphs[bs]
        graph.replay()
        return logits[:n]

    def _forward(self, bs: int) -> torch.Tensor:
        """The forward that is captured: every input read from the static buffers."""
        s = self.static[:, :bs]
        # NOTE: a padding row (live 0) stores its K/V at slot 0, the pool's padding slot
        loc = self.table.table[s[_ROWS], s[_POS]] * s[_LIVE]
        self.attn.bind(s[_ROWS], s[_SEQ])
        batch = ForwardBatch(input_ids=s[_IDS], positions=s[_POS], out_cache_loc=loc,
                             req_pool_indices=[0] * bs, prefix_lens=[0] * bs,
                             extend_lens=[1] * bs, logit_rows=self._arange[:bs],
                             seq_ids=list(range(bs)))
        return self.model(batch, self.attn)

    def _capture(self, bs: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # The static buffers hold the step about to run; warm-up and capture write their K/V
        # like the replay will, so run them on a copy marked all-padding, then restore.
        saved = self.static[:, :bs].clone()
        self.static[_LIVE, :bs] = 0
        self.static[_SEQ, :bs] = 1
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # Triton compiles, cuBLAS picks its kernels
                self._forward(bs)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._mempool):
            logits = self._forward(bs)
        self.static[:, :bs].copy_(saved)
        return graph, logits
