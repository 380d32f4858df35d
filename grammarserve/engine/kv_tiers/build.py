"""The engine's tiers from its config (``kv_disk_tier``, ``kv_disk_tier_bytes``,
``kv_tier_dtype``) and its memory plan (the host tier's bytes)."""

from __future__ import annotations

import logging

import torch

from grammarserve.attention.kv_pool import KVPool
from grammarserve.config import EngineConfig, kv_disk_tier_dir
from grammarserve.engine.kv_tiers.blocks import BlockLayout, model_fingerprint
from grammarserve.engine.kv_tiers.tiers import KVTiers

log = logging.getLogger(__name__)


def build_tiers(config: EngineConfig, model: torch.nn.Module, pool: KVPool,
                tokenizer_fingerprint: str, *, host: int) -> KVTiers | None:
    """The tiers ``config`` asks for under ``pool``, the host tier of ``host`` bytes (the
    memory plan's: ``kv_host_tier_bytes`` or its share; 0: off) (None: neither tier is on)."""
    layout = BlockLayout.of(pool, config.torch_tier_dtype)
    disk = kv_disk_tier_dir(config.kv_disk_tier)
    if host <= 0 and (disk is None or config.kv_disk_tier_bytes <= 0):
        return None
    numerics = (f"{config.quant_activations},{config.prefill_matmul},{config.gguf_blocks},"
                f"{config.torch_dtype}")
    fingerprint = model_fingerprint(model, f"{tokenizer_fingerprint}\x00{numerics}", layout)
    log.info("KV tiers: host %.0f MiB, disk %s (%.0f MiB), %s", host / 2**20, disk,
             config.kv_disk_tier_bytes / 2**20, layout.describe())
    return KVTiers(pool, layout, fingerprint, host_bytes=host, disk_dir=disk,
                   disk_bytes=config.kv_disk_tier_bytes)
