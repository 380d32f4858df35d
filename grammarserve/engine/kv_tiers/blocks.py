"""Blocks of KV: their layout, their keys, and the copies between the pool and a block.

A block is ``block_tokens`` consecutive positions of one sequence, starting at a multiple of
``block_tokens``; its tensor is ``[2, layers, block_tokens, kv_heads, head_dim]`` (K then V)
in the tier's storage dtype. Its key is a hash chain: block ``b``'s key digests block
``b - 1``'s key and block ``b``'s token ids, and the chain starts from the model's
fingerprint and the namespace. So a key names the whole prefix up to its block's end, in one
namespace, for one model, tokenizer, dtype and pool layout: two requests can only share a key
where the same model would have computed the same KV.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from grammarserve.attention.kv_pool import KVPool

DEFAULT_BLOCK_TOKENS = 64


@dataclass(frozen=True)
class BlockLayout:
    """The shape and storage dtype of one block (the pool's layout, the tier's dtype)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    pool_dtype: torch.dtype
    store_dtype: torch.dtype
    block_tokens: int = DEFAULT_BLOCK_TOKENS

    @classmethod
    def of(cls, pool: KVPool, store_dtype: torch.dtype | None,
           block_tokens: int = DEFAULT_BLOCK_TOKENS) -> BlockLayout:
        """The layout of ``pool``'s blocks, stored in ``store_dtype`` (None: the pool's)."""
        _, heads, dim = pool.k[0].shape
        return cls(len(pool.k), heads, dim, pool.dtype, store_dtype or pool.dtype,
                   block_tokens)

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        return (2, self.num_layers, self.block_tokens, self.num_kv_heads, self.head_dim)

    @property
    def nbytes(self) -> int:
        """Bytes of one block in the storage dtype."""
        n = 1
        for d in self.shape:
            n *= d
        return n * torch.empty((), dtype=self.store_dtype).element_size()

    @property
    def exact(self) -> bool:
        """Whether a block round-trips the pool's K/V bit for bit."""
        return self.store_dtype == self.pool_dtype

    def describe(self) -> str:
        return (f"layers={self.num_layers},kv_heads={self.num_kv_heads},"
                f"head_dim={self.head_dim},pool={self.pool_dtype},store={self.store_dtype},"
                f"block={self.block_tokens}")


def model_fingerprint(model: torch.nn.Module, tokenizer_fingerprint: str,
                      layout: BlockLayout) -> str:
    """A digest of what the KV of a token depends on: every tensor's name, shape, dtype and a
    strided sample of its values (two checkpoints of one shape differ there) - the parameters
    that hold values and the tensors of the modules' dataclass attributes (the quantized
    blocks that stand for weights left on the meta device) -, the tokenizer's fingerprint and
    the block layout."""
    digest = hashlib.sha256()
    digest.update(f"{tokenizer_fingerprint}\x00{layout.describe()}".encode())
    with torch.no_grad():
        for name, t in sorted(_value_tensors(model).items()):
            flat = t.detach().reshape(-1)
            step = max(1, flat.numel() // 64)
            sample = flat[::step][:64].to("cpu", torch.float32).numpy().tobytes()
            digest.update(f"{name}\x00{tuple(t.shape)}\x00{t.dtype}\x00".encode())
            digest.update(sample)
    return digest.hexdigest()[:32]


def _value_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    found = {n: t for n, t in model.state_dict().items() if t.device.type != "meta"}
    for module_name, module in model.named_modules():
        for attr, value in vars(module).items():
            items = value if isinstance(value, tuple) else (value,)
            for i, item in enumerate(items):
                if dataclasses.is_dataclass(item) and not isinstance(item, type):
                    for f in dataclasses.fields(item):
                        if isinstance(t := getattr(item, f.name), torch.Tensor) and t.numel():
                            found[f"{module_name}.{attr}.{i}.{f.name}"] = t
    return found


def chain_keys(tokens: list[int], namespace: str, fingerprint: str, block_tokens: int,
               start_key: str | None = None, first: int = 0) -> list[str]:
    """The keys of the complete blocks ``first ..`` of ``tokens`` (the chain's start from
    ``fingerprint`` and ``namespace``; ``start_key``: the key of block ``first - 1``, if the
    caller has it, saves hashing the blocks before ``first``)."""
    count = len(tokens) // block_tokens
    if start_key is None:
        key = hashlib.sha256(f"{fingerprint}\x00{namespace}".encode()).digest()
        begin = 0
    else:
        key, begin = bytes.fromhex(start_key), first
    arr = np.asarray(tokens[begin * block_tokens:count * block_tokens], dtype=np.int64)
    keys: list[str] = []
    for b in range(begin, count):
        at = (b - begin) * block_tokens
        key = hashlib.sha256(key + arr[at:at + block_tokens].tobytes()).digest()
        if b >= first:
            keys.append(key.hex())
    return keys


def gather(pool: KVPool, slots: torch.Tensor, layout: BlockLayout) -> list[torch.Tensor]:
    """The K/V of ``slots`` (a multiple of ``block_tokens`` long) as blocks, each
    ``[2, layers, block_tokens, kv_heads, head_dim]`` in the storage dtype, each a copy with
    its own storage on the host (pinned when the pool is on a GPU).

    Own storage, not views of one gathered tensor: a tier keeps and evicts blocks one by one,
    and a view keeps its whole base alive; views let a host tier that counted 146 MiB hold
    9 GiB of bases (a one-minute adversarial soak on the embedded model, ``soak.py``)."""
    kv = torch.stack([torch.stack([pool.k[i].index_select(0, slots) for i in range(len(pool.k))]),
                      torch.stack([pool.v[i].index_select(0, slots) for i in range(len(pool.v))])])
    n = slots.numel() // layout.block_tokens
    kv = kv.to(layout.store_dtype).reshape(2, layout.num_layers, n, layout.block_tokens,
                                           layout.num_kv_heads, layout.head_dim)
    if kv.device.type == "cpu":
        return [kv[:, :, i].clone(memory_format=torch.contiguous_format) for i in range(n)]
    out = []
    for i in range(n):  # NOTE: pinned, so promotion copies back to the GPU without a sync
        block = torch.empty(kv[:, :, i].shape, dtype=kv.dtype, pin_memory=True)
        block.copy_(kv[:, :, i])
        out.append(block)
    return out


def scatter(pool: KVPool, slots: torch.Tensor, blocks: list[torch.Tensor], offset: int) -> None:
    """Write ``blocks`` (consecutive, each ``[2, layers, block_tokens, ...]``) from position
    ``offset`` of the first one on into the pool at ``slots``."""
    kv = torch.cat(blocks, dim=2)[:, :, offset:offset + slots.numel()]
    kv = kv.to(pool.device, pool.dtype, non_blocking=True)
    for i in range(len(pool.k)):
        pool.k[i].index_copy_(0, slots, kv[0, i])
        pool.v[i].index_copy_(0, slots, kv[1, i])


def encode(block: torch.Tensor) -> bytes:
    """A block's bytes (its storage dtype's, row-major)."""
    return block.contiguous().view(torch.uint8).numpy().tobytes()


def decode(payload: bytes, layout: BlockLayout) -> torch.Tensor | None:
    """The block of ``payload``, or None if its length is not one block's."""
    if len(payload) != layout.nbytes:
        return None
    raw = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    return raw.view(layout.store_dtype).reshape(layout.shape)
