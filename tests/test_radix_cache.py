"""Radix cache: deterministic cases plus a hypothesis state machine against a naive model."""

from __future__ import annotations

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from grammarserve.attention.kv_pool import KVPool
from grammarserve.engine.radix_cache import RadixCache, _common_len

CAPACITY = 64


def _pool(capacity: int = CAPACITY) -> KVPool:
    return KVPool(capacity=capacity, num_layers=1, num_kv_heads=1, head_dim=1,
                  dtype=torch.float32)


def _insert_new(cache: RadixCache, tokens: list[int], ns: str = "") -> torch.Tensor:
    """Insert like a request would: reuse the cached prefix, allocate the rest, free dupes."""
    m = cache.match_prefix(tokens, ns)
    own = cache.pool.alloc(len(tokens) - m.length)
    slots = torch.cat([m.slots, own])
    already, _ = cache.insert(tokens, slots, ns)
    cache.pool.free(slots[m.length:already])
    return slots


def test_match_splits_and_shares() -> None:
    cache = RadixCache(_pool())
    a = _insert_new(cache, [1, 2, 3, 4, 5])
    m = cache.match_prefix([1, 2, 3, 9])
    assert m.length == 3 and torch.equal(m.slots, a[:3])
    b = _insert_new(cache, [1, 2, 3, 9, 9])
    assert torch.equal(b[:3], a[:3])
    assert cache.total_tokens == 7
    assert cache.pool.num_free == CAPACITY - 7


def test_evict_lru_and_locks() -> None:
    cache = RadixCache(_pool())
    _insert_new(cache, [1, 2, 3])
    _insert_new(cache, [7, 8])
    locked = cache.match_prefix([7, 8]).node
    cache.lock(locked)
    assert cache.evict(100) == 3  # only the unlocked branch goes
    assert cache.match_prefix([1, 2, 3]).length == 0
    assert cache.match_prefix([7, 8]).length == 2
    cache.unlock(locked)
    assert cache.evict(1) == 2
    assert cache.pool.num_free == CAPACITY and cache.total_tokens == 0


def test_lru_order() -> None:
    cache = RadixCache(_pool())
    _insert_new(cache, [1, 1])
    _insert_new(cache, [2, 2])
    cache.match_prefix([1, 1])  # touch: [2, 2] is now least recently used
    cache.evict(1)
    assert cache.match_prefix([1, 1]).length == 2
    assert cache.match_prefix([2, 2]).length == 0


def test_namespaces_never_share() -> None:
    cache = RadixCache(_pool())
    _insert_new(cache, [1, 2, 3], ns="tenant-a")
    assert cache.match_prefix([1, 2, 3], "tenant-b").length == 0
    assert cache.match_prefix([1, 2, 3], "tenant-a").length == 3


class RadixMachine(RuleBasedStateMachine):
    """Random insert / match / lock / unlock / evict sequences. The naive model is a dict from
    (namespace, prefix) to the slot of its last token, written at insert time."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = RadixCache(_pool())
        self.ref: dict[tuple[str, tuple[int, ...]], int] = {}
        self.locks: list[tuple[object, tuple[str, list[int]]]] = []
        self.evicted_since_insert = False

    seqs = st.lists(st.integers(0, 3), min_size=1, max_size=8)
    namespaces = st.sampled_from(["", "b"])

    @rule(tokens=seqs, ns=namespaces)
    def insert(self, tokens: list[int], ns: str) -> None:
        m = self.cache.match_prefix(tokens, ns)
        need = len(tokens) - m.length
        if need > self.cache.pool.num_free:
            self.cache.evict(need - self.cache.pool.num_free)
            self.evicted_since_insert = True
            m = self.cache.match_prefix(tokens, ns)
            need = len(tokens) - m.length
            if need > self.cache.pool.num_free:
                return
        slots = _insert_new(self.cache, tokens, ns)
        for i in range(len(tokens)):
            self.ref[(ns, tuple(tokens[:i + 1]))] = int(slots[i])

    @rule(tokens=seqs, ns=namespaces)
    def match(self, tokens: list[int], ns: str) -> None:
        m = self.cache.match_prefix(tokens, ns)
        for i in range(m.length):  # every matched slot is the one inserted for that prefix
            assert self.ref[(ns, tuple(tokens[:i + 1]))] == int(m.slots[i])
        if not self.evicted_since_insert:
            longest = max((i + 1 for i in range(len(tokens))
                           if (ns, tuple(tokens[:i + 1])) in self.ref), default=0)
            assert m.length == longest

    @rule(tokens=seqs, ns=namespaces)
    def lock(self, tokens: list[int], ns: str) -> None:
        m = self.cache.match_prefix(tokens, ns)
        self.cache.lock(m.node)
        self.locks.append((m.node, (ns, tokens[:m.length])))

    @rule()
    def unlock(self) -> None:
        if self.locks:
            node, _ = self.locks.pop()
            self.cache.unlock(node)  # type: ignore[arg-type]

    @rule(n=st.integers(1, CAPACITY))
    def evict(self, n: int) -> None:
        self.cache.evict(n)
        self.evicted_since_insert = True
        for _, (ns, prefix) in self.locks:  # locked paths survive any eviction
            assert self.cache.match_prefix(prefix, ns).length == len(prefix)

    @invariant()
    def slots_conserved(self) -> None:
        free = self.cache.pool._free.tolist()
        owned = [int(s) for n in self.cache._leaves() for s in _path_slots(n)]
        assert len(set(free)) == len(free), "double free"
        assert not set(free) & set(owned), "a tree slot is also free"
        assert self.cache.pool.num_free + self.cache.total_tokens == CAPACITY
        assert 0 <= self.cache.locked_tokens <= self.cache.total_tokens


def _path_slots(node: object) -> list[int]:
    out: list[int] = []
    while getattr(node, "parent", None) is not None:
        out.extend(node.value.tolist())  # type: ignore[attr-defined]
        node = node.parent  # type: ignore[attr-defined]
    return out


TestRadixMachine = RadixMachine.TestCase
TestRadixMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_common_len_of_long_runs_matches_a_token_by_token_scan() -> None:
    key = list(range(1000))
    for start in (0, 3):
        for diff in (0, 1, 255, 256, 257, 511, 700, 999, None):
            tokens = [-1] * start + key[:900 if diff is None else 1000]
            if diff is not None:
                tokens[start + diff] = -7
            want = 0
            while (want < min(len(key), len(tokens) - start)
                   and key[want] == tokens[start + want]):
                want += 1
            assert _common_len(key, tokens, start) == want == (900 if diff is None else diff)
