"""KV tiers under the radix prefix cache: evicted prefixes kept in host memory and on disk.

``blocks``: the block layout, the keys (a hash chain over the namespace, the model's
fingerprint and the tokens) and the copies between the pool and a block. ``host``: the
host-memory tier. ``disk``: the disk tier (files shared by processes, found again after a
restart). ``tiers``: :class:`KVTiers`, which the scheduler and the radix cache call.
"""
