"""The engine's memory plan: how what is left after the weights is shared between the KV pool,
the decode mirror, the host KV tier and one forward's activations.

:func:`plan_memory` is pure (every fact it reads is a field of :class:`PlanInputs`) and returns
the one :class:`MemoryPlan` the engine builds from, logs at start-up and reports in its stats.
Its contract, for defaults and any model whose weights fit:

- activations first: the reserve for one forward of ``max_batch_tokens`` (``rest`` = what is
  left after it);
- ``kv_fraction`` of ``rest`` for the pool, the mirror and (varlen) one layer's gathered K/V;
  the mirror takes half the pool's tokens, at least :data:`MIRROR_FLOOR` where that still leaves
  the pool as many, and as many as the pool below that (it never eats the pool);
- the host tier (default) takes the pool's size in its dtype, at most
  :data:`HOST_TIER_SHARE` of ``rest``; on CPU, where it shares the pool's memory, the pool
  comes first: a pool below :data:`USEFUL_KV_TOKENS` grows into the tier's share (up to that
  size), and the tier keeps what is left of the two shares, so pool + mirror + gather + tier +
  activations never exceed ``available``;
- a planned pool below :data:`MIN_PLANNED_KV_TOKENS` grows to that minimum out of the whole of
  ``rest`` (mirror off); where even that does not fit, :class:`OutOfMemoryError` in one line
  naming the weights, the available memory and what was needed.

Explicit settings (``kv_tokens``, ``mirror_tokens``, ``host_tier_bytes``) are taken as given;
only the mirror's and the tier's defaults under an explicit pool shrink to the memory left.
"""

from __future__ import annotations

from dataclasses import dataclass

from grammarserve.errors import OutOfMemoryError

#: The smallest KV pool a planned (not explicitly sized) engine starts with: below it, the
#: machine has no room to serve, and starting would only fail every request later.
MIN_PLANNED_KV_TOKENS = 512
#: The decode mirror's default floor (tokens): 64 decoding rows of 512 positions.
MIRROR_FLOOR = 32768
#: The default host tier takes at most this share of the memory left after the activations.
HOST_TIER_SHARE = 0.25
#: On CPU a planned pool below this many tokens takes the host tier's share first (a tier
#: only keeps what a pool evicts; a pool of a few requests is the shortage).
USEFUL_KV_TOKENS = 8192

_MIB = 2**20


@dataclass(frozen=True)
class PlanInputs:
    """The facts and settings a plan is made from (bytes unless named otherwise)."""

    device: str  # "cpu" or "cuda": whether the host tier shares the pool's memory
    available: int  # free on the pool's device after the weights were loaded
    host_available: int  # free host memory (the host tier's); = available on CPU
    weights: int  # what the loaded weights take (reported, already out of ``available``)
    activations: int  # one forward's transients (memory.activation_reserve_bytes)
    kv_fraction: float  # share of what the activations leave for pool + mirror + gather
    bytes_per_token: int  # one token's K and V over all layers, in the pool's dtype
    tier_bytes_per_token: int  # the same in the tiers' dtype
    gather_layers: int = 0  # varlen: the layer count (one layer's K/V is gathered per call)
    kv_tokens: int | None = None  # explicit pool size (None: planned)
    mirror_tokens: int | None = None  # explicit mirror (None: default, 0: off)
    host_tier_bytes: int | None = None  # explicit host tier (None: default, 0: off)
    prefix_cache: bool = True  # the tiers sit under the prefix cache: none without it
    tier_block_tokens: int = 64  # the tiers hold whole blocks (kv_tiers.blocks)


@dataclass(frozen=True)
class MemoryPlan:
    """What the engine allocates (or may grow to: the mirror and the tier fill lazily)."""

    device: str
    available_bytes: int  # after the weights, when planned
    weights_bytes: int
    activation_bytes: int
    bytes_per_token: int
    kv_tokens: int
    mirror_tokens: int
    gather_bytes: int  # varlen: one layer's gathered K/V of a full pool
    host_tier_bytes: int
    tier_bytes_per_token: int

    @property
    def kv_bytes(self) -> int:
        return self.kv_tokens * self.bytes_per_token

    @property
    def mirror_bytes(self) -> int:
        return self.mirror_tokens * self.bytes_per_token

    @property
    def host_tier_tokens(self) -> int:
        return self.host_tier_bytes // max(1, self.tier_bytes_per_token)

    @property
    def device_bytes(self) -> int:
        """The plan's total on the pool's device (the host tier counts on CPU only)."""
        tier = self.host_tier_bytes if self.device == "cpu" else 0
        return self.kv_bytes + self.mirror_bytes + self.gather_bytes + tier + \
            self.activation_bytes

    def parts(self) -> dict[str, int]:
        """Bytes of each part (the ``part`` label of the memory-plan gauge)."""
        return {"weights": self.weights_bytes, "available": self.available_bytes,
                "kv_pool": self.kv_bytes, "mirror": self.mirror_bytes,
                "gather": self.gather_bytes, "host_tier": self.host_tier_bytes,
                "activations": self.activation_bytes}

    def describe(self) -> str:
        """One line: each part in MiB, with its tokens where it has tokens."""
        def mib(n: int) -> str:
            return f"{n / _MIB:.0f} MiB"
        gather = f", gather {mib(self.gather_bytes)}" if self.gather_bytes else ""
        tier_where = "" if self.device == "cpu" else " (host)"
        return (f"{self.device}: weights {mib(self.weights_bytes)}, available after them "
                f"{mib(self.available_bytes)}; KV pool {self.kv_tokens} tokens "
                f"{mib(self.kv_bytes)}, decode mirror {self.mirror_tokens} tokens "
                f"{mib(self.mirror_bytes)}{gather}, host tier{tier_where} "
                f"{self.host_tier_tokens} tokens {mib(self.host_tier_bytes)}, activations "
                f"{mib(self.activation_bytes)}; planned total {mib(self.device_bytes)}")


def default_mirror_tokens(capacity: int) -> int:
    """The mirror a pool of ``capacity`` tokens gets by default: half of it, at least
    :data:`MIRROR_FLOOR` where the pool is that large, else the pool's size."""
    return max(capacity // 2, min(MIRROR_FLOOR, capacity))


def plan_memory(p: PlanInputs) -> MemoryPlan:
    """The plan for ``p`` (see the module docstring); raises :class:`OutOfMemoryError` where
    the weights leave no room for the activations and a minimal pool."""
    rest = max(0, p.available - p.activations)
    bpt = p.bytes_per_token
    per_token = bpt * (1 + (1 / p.gather_layers if p.gather_layers else 0))
    if p.kv_tokens is not None:
        kv = p.kv_tokens
        room = max(0, rest - int(kv * per_token))
        mirror = p.mirror_tokens if p.mirror_tokens is not None else \
            min(max(kv // 2, MIRROR_FLOOR), room // bpt)
    else:
        kv, mirror = _planned_pool(p.kv_fraction * rest, bpt, per_token, p.mirror_tokens)
        if kv < USEFUL_KV_TOKENS and _tier_yields(p):
            useful = USEFUL_KV_TOKENS * per_token + bpt * (
                default_mirror_tokens(USEFUL_KV_TOKENS) if p.mirror_tokens is None
                else p.mirror_tokens)
            kv, mirror = _planned_pool(min(useful, (p.kv_fraction + HOST_TIER_SHARE) * rest),
                                       bpt, per_token, p.mirror_tokens)
        if kv < MIN_PLANNED_KV_TOKENS:
            kv, mirror = MIN_PLANNED_KV_TOKENS, 0
            if kv * per_token > rest:
                raise _no_room(p, rest)
    gather = int(kv * (per_token - bpt))
    used = kv * bpt + mirror * bpt + gather
    room = max(0, rest - used)
    if p.kv_tokens is None and _tier_yields(p):  # the two shares' remainder
        room = min(room, max(0, int((p.kv_fraction + HOST_TIER_SHARE) * rest) - used))
    return MemoryPlan(p.device, p.available, p.weights, p.activations, bpt, kv, mirror, gather,
                      _host_tier(p, kv, rest, room), p.tier_bytes_per_token)


def _tier_yields(p: PlanInputs) -> bool:
    """Whether the default host tier shares the pool's memory (and gives way to it)."""
    return p.device == "cpu" and p.prefix_cache and p.host_tier_bytes is None


def _planned_pool(budget: float, bpt: int, per_token: float,
                  mirror: int | None) -> tuple[int, int]:
    """(pool, mirror) tokens whose cost fills ``budget``."""
    if mirror is not None:
        return max(0, int((budget - mirror * bpt) / per_token)), mirror
    cap = int(budget / (per_token + bpt / 2))  # mirror = pool / 2
    if cap // 2 >= MIRROR_FLOOR:
        return cap, cap // 2
    cap = int((budget - MIRROR_FLOOR * bpt) / per_token)  # the floor, where the pool keeps as many
    if cap >= MIRROR_FLOOR:
        return cap, MIRROR_FLOOR
    cap = max(0, int(budget / (per_token + bpt)))  # mirror = pool
    return cap, cap


def _host_tier(p: PlanInputs, kv: int, rest: int, room: int) -> int:
    """The host tier's bytes: the setting, or the pool's size within the shares."""
    if not p.prefix_cache:
        return 0
    if p.host_tier_bytes is not None:
        return p.host_tier_bytes
    share = min(HOST_TIER_SHARE * rest, room) if p.device == "cpu" else \
        HOST_TIER_SHARE * p.host_available
    block = p.tier_block_tokens * p.tier_bytes_per_token
    return max(0, min(kv * p.tier_bytes_per_token, int(share)) // block * block)


def _no_room(p: PlanInputs, rest: int) -> OutOfMemoryError:
    need = p.activations + MIN_PLANNED_KV_TOKENS * p.bytes_per_token
    return OutOfMemoryError(
        f"the model does not fit in {p.device} memory: weights {p.weights / _MIB:.0f} MiB "
        f"loaded, {p.available / _MIB:.0f} MiB available after them, "
        f"{need / _MIB:.0f} MiB needed ({p.activations / _MIB:.0f} MiB for one forward's "
        f"activations + {MIN_PLANNED_KV_TOKENS} KV tokens); free memory, lower max_batch_tokens "
        "or use a smaller model")


def weights_fit_error(device: str, weights: int, available: int, activations: int,
                      min_kv_bytes: int) -> OutOfMemoryError | None:
    """The error for a model whose ``weights`` (an estimate made before loading) plus one
    forward's activations and a minimal pool exceed ``available`` memory; None where they fit."""
    need = weights + activations + min_kv_bytes
    if need <= available:
        return None
    return OutOfMemoryError(
        f"the model does not fit in {device} memory: weights {weights / _MIB:.0f} MiB, "
        f"{available / _MIB:.0f} MiB available, {need / _MIB:.0f} MiB needed (with "
        f"{activations / _MIB:.0f} MiB for one forward's activations and "
        f"{min_kv_bytes / _MIB:.0f} MiB for {MIN_PLANNED_KV_TOKENS} KV tokens); free memory, "
        "lower max_batch_tokens or use a smaller model")
