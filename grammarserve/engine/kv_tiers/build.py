"""The engine's tiers from its config (``EngineConfig.kv_host_tier_bytes``, ``kv_disk_tier``,
``kv_disk_tier_bytes``, ``kv_tier_dtype``)."""

from __future__ import annotations

import logging

import torch

from grammarserve.attention.kv_pool import KVPool
from grammarserve.config import EngineConfig, kv_disk_tier_dir
from grammarserve.engine.kv_tiers.blocks import BlockLayout, model_fingerprint
from grammarserve.engine.kv_tiers.tiers import KVTiers
from grammarserve.engine.memory import available_memory_bytes

log = logging.getLogger(__name__)

#: The default host tier takes at most this share of the host memory available at start-up.
HOST_TIER_MEMORY_SHARE = 0.25


def host_tier_bytes(config: EngineConfig, pool: KVPool, layout: BlockLayout) -> int:
    """``kv_host_tier_bytes``, or its default: the pool's size in the tier's dtype, at most
    :data:`HOST_TIER_MEMORY_SHARE` of the host memory available now."""
    if config.kv_host_tier_bytes is not None:
        return config.kv_host_tier_bytes
    blocks = pool.capacity // layout.block_tokens
    return min(blocks * layout.nbytes,
               int(HOST_TIER_MEMORY_SHARE * available_memory_bytes(torch.device("cpu"))))


def build_tiers(config: EngineConfig, model: torch.nn.Module, pool: KVPool,
                tokenizer_fingerprint: str) -> KVTiers | None:
    """The tiers ``config`` asks for under ``pool`` (None: neither tier is on)."""
    layout = BlockLayout.of(pool, config.torch_tier_dtype)
    host = host_tier_bytes(config, pool, layout)
    disk = kv_disk_tier_dir(config.kv_disk_tier)
    if host <= 0 and (disk is None or config.kv_disk_tier_bytes <= 0):
        return None
    numerics = f"{config.quant_activations},{config.gguf_blocks},{config.torch_dtype}"
    fingerprint = model_fingerprint(model, f"{tokenizer_fingerprint}\x00{numerics}", layout)
    log.info("KV tiers: host %.0f MiB, disk %s (%.0f MiB), %s", host / 2**20, disk,
             config.kv_disk_tier_bytes / 2**20, layout.describe())
    return KVTiers(pool, layout, fingerprint, host_bytes=host, disk_dir=disk,
                   disk_bytes=config.kv_disk_tier_bytes)
