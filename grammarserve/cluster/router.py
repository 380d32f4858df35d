"""Which engine replica serves a request: the policies behind the Ray Serve ingress and the
router simulation (``benchmarks/bench_router.py``).

Pure Python (no Ray, no torch), so the policies can be unit-tested and replayed in a simulation.

- :class:`PrefixGrammarRouter` (ours): a key from the request's cache namespace, a hash of the
  first blocks of its rendered prompt token ids and its grammar key; rendezvous
  (highest-random-weight) hashing of the key over the replica ids picks a replica, so requests
  sharing a prompt prefix and a constraint meet the replica whose radix cache and grammar cache
  already hold them, and a replica joining or leaving moves only its own keys. Bounded by load:
  when the chosen replica's queue is above a threshold, the less loaded of the key's two
  highest-scoring replicas serves it (the runner-up is fixed per key, so its caches warm too).
- :class:`RoundRobin` and :class:`PowerOfTwo` (Ray Serve's default: the less loaded of two
  random replicas) for comparison.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from grammarserve.constraints import Constraint
from grammarserve.errors import InvalidRequestError


@dataclass(frozen=True)
class RouteRequest:
    """What a policy knows of one engine request.

    Parameters
    ----------
    namespace:
        The engine's prefix-cache namespace (tenant and ``cache_namespace``): prefixes are shared
        only within one, so it is part of the key.
    prompt:
        The rendered prompt's token ids (chat template and tools applied).
    grammar_key:
        :func:`grammar_key` of the request's constraint (``""``: unconstrained).
    """

    namespace: str
    prompt: Sequence[int]
    grammar_key: str = ""


def grammar_key(constraint: Constraint | None) -> str:
    """The routing key of a constraint: canonical JSON of the arguments the engine's compiler
    is called with (``Constraint.compile_args``).

    NOTE: every replica builds its compiler from the same model and options, so its grammar
    cache key (``GrammarSpec.key``: normalized schema, options, tokenizer fingerprint) is a
    function of exactly these arguments; equal keys here mean one cache entry there. (Two
    inputs that normalize to one grammar get two keys here: they may land on two replicas.)
    """
    if constraint is None:
        return ""
    kind, args, kwargs = constraint.compile_args()
    try:
        return json.dumps([kind, args, kwargs], sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):  # not JSON (a caller's object): its repr still tells apart
        return repr((kind, args, sorted(kwargs.items())))


@dataclass(frozen=True)
class RouterConfig:
    """How :class:`PrefixGrammarRouter` keys and bounds.

    Parameters
    ----------
    block_tokens:
        Tokens per prompt block (the prefix is hashed in whole blocks).
    max_blocks:
        Leading blocks hashed at most. Only blocks before the prompt's last token count, so the
        request's own tail (the user turn) stays out of the key where the prompt is long enough;
        a prompt shorter than one block is hashed whole.
    queue_threshold:
        A replica whose queue (requests waiting or running) is at most this is never
        overloaded.
    load_factor:
        Above ``queue_threshold``, a replica is overloaded when its queue exceeds this times the
        mean queue of all replicas (bounded-load consistent hashing).
    """

    block_tokens: int = 16
    max_blocks: int = 8
    queue_threshold: int = 4
    load_factor: float = 1.5

    def __post_init__(self) -> None:
        if self.block_tokens < 1 or self.max_blocks < 1:
            raise InvalidRequestError("block_tokens and max_blocks must be >= 1",
                                      param="router")
        if self.queue_threshold < 0 or self.load_factor < 1.0:
            raise InvalidRequestError("queue_threshold must be >= 0 and load_factor >= 1",
                                      param="router")

    def prefix_tokens(self, prompt_len: int) -> int:
        """How many leading tokens of a ``prompt_len``-token prompt the key hashes."""
        whole = (prompt_len - 1) // self.block_tokens  # blocks before the last token
        if whole <= 0:
            return prompt_len
        return min(whole, self.max_blocks) * self.block_tokens


def route_key(request: RouteRequest, config: RouterConfig) -> bytes:
    """The 16-byte key of ``request``: namespace, hashed prompt prefix and grammar key."""
    h = hashlib.blake2b(digest_size=16)
    for part in (request.namespace.encode(), request.grammar_key.encode()):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    n = config.prefix_tokens(len(request.prompt))
    h.update(n.to_bytes(8, "little"))
    for token in itertools.islice(request.prompt, n):
        h.update(int(token).to_bytes(4, "little", signed=True))
    return h.digest()


def rendezvous_scores(key: bytes, replicas: Sequence[str]) -> list[tuple[int, str]]:
    """``(score, replica)`` by highest random weight first (ties broken by replica id)."""
    scored = [(int.from_bytes(hashlib.blake2b(key + r.encode(), digest_size=8).digest(),
                              "little"), r) for r in replicas]
    scored.sort(reverse=True)
    return scored


class RoutingPolicy(ABC):
    """Chooses the replica of one engine request.

    Contract: ``choose`` is called with the ids of the replicas that can take requests now
    (non-empty, each id stable for the replica's life) and each one's current queue (requests
    waiting or running there; a missing id counts as 0). It returns one of ``replicas``. It
    must be cheap (called once per engine request) and may keep state (a round-robin cursor);
    it is not thread-safe: callers serialize calls (the ingress's event loop does).
    """

    name: str

    @abstractmethod
    def choose(self, request: RouteRequest, replicas: Sequence[str],
               loads: Mapping[str, int]) -> str:
        """The replica that serves ``request``."""


def _check(replicas: Sequence[str]) -> None:
    if not replicas:
        raise ValueError("no replica to route to")


class RoundRobin(RoutingPolicy):
    """Each request to the next replica in turn (ignores prompt, grammar and load)."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: RouteRequest, replicas: Sequence[str],
               loads: Mapping[str, int]) -> str:
        _check(replicas)
        chosen = replicas[self._next % len(replicas)]
        self._next += 1
        return chosen


class PowerOfTwo(RoutingPolicy):
    """The less loaded of two replicas drawn at random (Ray Serve's default router)."""

    name = "power_of_two"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def choose(self, request: RouteRequest, replicas: Sequence[str],
               loads: Mapping[str, int]) -> str:
        _check(replicas)
        if len(replicas) == 1:
            return replicas[0]
        a, b = self._rng.sample(list(replicas), 2)
        return a if loads.get(a, 0) <= loads.get(b, 0) else b


class PrefixGrammarRouter(RoutingPolicy):
    """Rendezvous hashing on (namespace, prompt-prefix hash, grammar key), bounded by load.

    ``last_fallback`` tells whether the latest choice left the key's first replica because it
    was overloaded (the ingress counts these).
    """

    name = "prefix_grammar"

    def __init__(self, config: RouterConfig | None = None) -> None:
        self.config = config or RouterConfig()
        self.last_fallback = False

    def overloaded(self, replica: str, replicas: Sequence[str],
                   loads: Mapping[str, int]) -> bool:
        """Whether ``replica``'s queue is above the threshold (see :class:`RouterConfig`)."""
        mean = sum(loads.get(r, 0) for r in replicas) / len(replicas)
        bound = max(self.config.queue_threshold, math.ceil(self.config.load_factor * mean))
        return loads.get(replica, 0) > bound

    def ranked(self, request: RouteRequest, replicas: Sequence[str]) -> list[str]:
        """``replicas`` in the key's rendezvous order (the first is its home replica)."""
        return [r for _, r in rendezvous_scores(route_key(request, self.config), replicas)]

    def choose(self, request: RouteRequest, replicas: Sequence[str],
               loads: Mapping[str, int]) -> str:
        _check(replicas)
        ranked = self.ranked(request, replicas)
        first = ranked[0]
        self.last_fallback = False
        if len(ranked) == 1 or not self.overloaded(first, replicas, loads):
            return first
        second = ranked[1]
        if loads.get(second, 0) < loads.get(first, 0):
            self.last_fallback = True
            return second
        return first


#: The policies by name (``--router``).
POLICIES: dict[str, type[RoutingPolicy]] = {
    p.name: p for p in (PrefixGrammarRouter, PowerOfTwo, RoundRobin)}


def make_policy(name: str, *, config: RouterConfig | None = None,
                seed: int | None = None) -> RoutingPolicy:
    """A policy by name: ``prefix_grammar`` (``config``), ``power_of_two`` (``seed``) or
    ``round_robin``."""
    if name == PrefixGrammarRouter.name:
        return PrefixGrammarRouter(config)
    if name == PowerOfTwo.name:
        return PowerOfTwo(seed)
    if name == RoundRobin.name:
        return RoundRobin()
    raise InvalidRequestError(f"unknown router {name!r}; use one of {sorted(POLICIES)}",
                              param="router")
