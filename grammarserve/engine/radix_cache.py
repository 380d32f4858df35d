"""Radix tree over token ids whose values are KV slot indices (prefix sharing across requests).

Every slot is owned by exactly one party: the pool's free list, the tree, or one request (slots it
computed that are not inserted yet). ``insert`` reports how much of a sequence was already present
so the caller frees its duplicate slots; ``evict`` returns unlocked leaves' slots to the pool in
LRU order (first handing each leaf's whole path to ``on_evict``, which may keep a copy of its KV
in a lower tier: ``engine/kv_tiers``). Running requests lock the path to their last matched node,
so nothing they read is evicted. Each namespace has its own root: no prefix is ever shared across
namespaces.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from grammarserve.attention.kv_pool import KVPool

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = ""

#: Called with an evicted leaf's path from its root (tokens, slots), its namespace and where
#: the leaf starts, before the leaf's slots go back to the pool.
EvictHook = Callable[[list[int], torch.Tensor, str, int], None]


@dataclass(eq=False)
class TreeNode:
    """A run of tokens (``key``) and their KV slots (``value``, same length)."""

    key: list[int] = field(default_factory=list)
    value: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    parent: TreeNode | None = None
    children: dict[int, TreeNode] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0

    @property
    def is_root(self) -> bool:
        return self.parent is None


@dataclass(frozen=True)
class MatchResult:
    """Slots of the longest cached prefix, and the deepest node covering it (lock this one)."""

    slots: torch.Tensor
    node: TreeNode

    @property
    def length(self) -> int:
        return int(self.slots.numel())


class RadixCache:
    """Prefix cache over a :class:`KVPool` (see the module docstring for the ownership rules)."""

    def __init__(self, pool: KVPool, on_evict: EvictHook | None = None) -> None:
        self.pool = pool
        self.on_evict = on_evict
        self.roots: dict[str, TreeNode] = {}
        self._namespaces: dict[int, str] = {}  # id(root) -> its namespace
        self._clock = itertools.count(1)
        self.total_tokens = 0  # slots owned by the tree
        self.locked_tokens = 0  # of those, on a path locked by a running request
        self.evicted_tokens = 0  # counter

    def root(self, namespace: str = DEFAULT_NAMESPACE) -> TreeNode:
        node = self.roots.get(namespace)
        if node is None:
            node = self.roots[namespace] = TreeNode(lock_ref=1)  # roots are never evicted
            self._namespaces[id(node)] = namespace
        return node

    def match_prefix(self, tokens: list[int], namespace: str = DEFAULT_NAMESPACE) -> MatchResult:
        """Longest cached prefix of ``tokens``; splits a node when the match ends inside it."""
        node, _, parts = self._walk(tokens, namespace)
        slots = torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64,
                                                           device=self.pool.device)
        return MatchResult(slots, node)

    def insert(self, tokens: list[int], slots: torch.Tensor,
               namespace: str = DEFAULT_NAMESPACE) -> tuple[int, TreeNode]:
        """Insert ``tokens`` with their ``slots``; the tree takes ownership of the new part.

        Returns ``(already, node)``: how many leading tokens were already cached (the caller still
        owns ``slots[:already]`` and must free those it computed itself) and the deepest node.
        """
        if len(tokens) != slots.numel():
            raise ValueError(f"{len(tokens)} tokens but {slots.numel()} slots")
        node, pos, _ = self._walk(tokens, namespace)
        if pos < len(tokens):
            new = TreeNode(key=list(tokens[pos:]), value=slots[pos:].clone(), parent=node,
                           last_access=node.last_access)
            node.children[tokens[pos]] = new
            self.total_tokens += len(new.key)
            node = new
        return pos, node

    def _walk(self, tokens: list[int],
              namespace: str) -> tuple[TreeNode, int, list[torch.Tensor]]:
        """Follow ``tokens`` down the tree (splitting where the match ends inside a node) and
        touch every node on the way; returns the deepest node, the matched length and the slot
        runs along the path."""
        node = self.root(namespace)
        now = next(self._clock)
        node.last_access = now
        parts: list[torch.Tensor] = []
        pos = 0
        while pos < len(tokens) and tokens[pos] in node.children:
            child = node.children[tokens[pos]]
            n = _common_len(child.key, tokens, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            parts.append(child.value)
            pos += n
            node = child
        return node, pos, parts

    def lock(self, node: TreeNode) -> None:
        """Protect the path root..node from eviction (one count per running request)."""
        while not node.is_root:
            if node.lock_ref == 0:
                self.locked_tokens += len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: TreeNode) -> None:
        while not node.is_root:
            if node.lock_ref <= 0:
                raise RuntimeError("unlock() without a matching lock()")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.locked_tokens -= len(node.key)
            node = node.parent  # type: ignore[assignment]

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` slots from unlocked leaves, least recently used first.
        Returns how many were freed (less when not enough is evictable)."""
        heap = [(n.last_access, id(n), n) for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            if self.on_evict is not None:
                self._hand_down(leaf)
            self.pool.free(leaf.value)
            del parent.children[leaf.key[0]]
            freed += len(leaf.key)
            self.total_tokens -= len(leaf.key)
            if not parent.is_root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        self.evicted_tokens += freed
        return freed

    def _hand_down(self, leaf: TreeNode) -> None:
        """Give ``on_evict`` the leaf's path; a failure there loses the copy, never the pool."""
        nodes: list[TreeNode] = []
        node: TreeNode | None = leaf
        while node is not None and not node.is_root:
            nodes.append(node)
            node = node.parent
        assert node is not None
        nodes.reverse()
        tokens = [t for n in nodes for t in n.key]
        try:
            assert self.on_evict is not None
            self.on_evict(tokens, torch.cat([n.value for n in nodes]),
                          self._namespaces[id(node)], len(tokens) - len(leaf.key))
        except Exception:
            log.exception("a lower KV tier failed to keep an evicted prefix")

    def reset(self) -> None:
        """Drop every unlocked entry (frees their slots)."""
        self.evict(self.total_tokens)

    def _leaves(self) -> list[TreeNode]:
        out, stack = [], list(self.roots.values())
        while stack:
            node = stack.pop()
            if not node.children and not node.is_root:
                out.append(node)
            stack.extend(node.children.values())
        return out

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut ``child`` after ``n`` tokens; returns the new upper node (which keeps the locks)."""
        parent = child.parent
        assert parent is not None
        upper = TreeNode(key=child.key[:n], value=child.value[:n], parent=parent,
                         lock_ref=child.lock_ref, last_access=child.last_access)
        parent.children[child.key[0]] = upper
        child.key, child.value, child.parent = child.key[n:], child.value[n:], upper
        upper.children[child.key[0]] = child
        return upper


def _common_len(key: list[int], tokens: list[int], start: int) -> int:
    n = min(len(key), len(tokens) - start)
    i = 0
    while i < n:  # NOTE: runs of 256 compared as list slices (C) first: prompts of 5k tokens
        step = min(256, n - i)
        if key[i:i + step] != tokens[start + i:start + i + step]:
            break
        i += step
    while i < n and key[i] == tokens[start + i]:
        i += 1
    return i
