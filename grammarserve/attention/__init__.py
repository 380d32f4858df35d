"""The layer under both ``engine/`` and ``models/``: the batch description of one forward pass
(:class:`ForwardBatch`), the token-slot KV pool and request-to-token table, and the attention
backends that read them. Nothing here imports ``engine/``, ``models/`` or anything above."""

from grammarserve.attention.backend import AttentionBackend, TorchSDPABackend
from grammarserve.attention.forward_batch import ForwardBatch
from grammarserve.attention.kv_pool import KVPool, ReqToTokenPool

__all__ = ["AttentionBackend", "ForwardBatch", "KVPool", "ReqToTokenPool", "TorchSDPABackend"]
