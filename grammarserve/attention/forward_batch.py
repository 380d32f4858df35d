"""The ragged batch handed from the model runner to the model for one forward pass."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ForwardBatch:
    """One forward pass over a ragged batch.

    Request ``i`` contributes ``extend_lens[i]`` new tokens (a prefill chunk, one decode token or a
    jump-forward span) on top of ``prefix_lens[i]`` tokens whose KV is already in the pool. Its new
    tokens occupy rows ``[starts[i], starts[i] + extend_lens[i])`` of ``input_ids``.

    NOTE: the KV slots of the whole sequence (prefix and new tokens) must already be written in
    ``req_to_token[req_pool_indices[i], :seq_len]`` before the forward; ``out_cache_loc`` repeats
    the slots of the new tokens so that every layer can store K/V with one index_copy.
    """

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    out_cache_loc: torch.Tensor  # [T] int64, KV slot of each new token
    req_pool_indices: list[int]
    prefix_lens: list[int]
    extend_lens: list[int]
    logit_rows: torch.Tensor  # [R] int64 rows of the batch whose logits are returned
    seq_ids: list[int]  # stable identity of each request across steps (KV mirror reuse)

    @property
    def batch_size(self) -> int:
        return len(self.extend_lens)

    @property
    def seq_lens(self) -> list[int]:
        return [p + e for p, e in zip(self.prefix_lens, self.extend_lens)]

    @property
    def starts(self) -> list[int]:
        out, acc = [], 0
        for n in self.extend_lens:
            out.append(acc)
            acc += n
        return out
