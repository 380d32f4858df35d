"""Earlier replies of a namespace (a tenant, a batch job), bounded in tokens, indexed by their
n-grams: a draft continues the current reply the way an earlier one went on (the 64th line of
an extraction job drafts its structure from the 63 before it)."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence

from grammarserve.engine.spec.ngram import MAX_N, MIN_N, Match

CONTEXT = 4  # prompt tokens kept before each reply, so its first tokens can be drafted too


class ReplyIndex:
    """The replies of one namespace, newest last, at most ``max_tokens`` tokens in all."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._replies: deque[tuple[int, list[int]]] = deque()
        self._by_serial: dict[int, list[int]] = {}
        self._pos: dict[tuple[int, ...], tuple[int, int]] = {}  # n-gram -> (reply, position)
        self._serial = 0
        self._tokens = 0

    def add(self, tokens: list[int]) -> None:
        """Keep ``tokens`` (a finished reply, after a few tokens of its prompt); the oldest
        replies go when the bound is passed."""
        tokens = tokens[-self.max_tokens:]
        self._serial += 1
        serial = self._serial
        self._replies.append((serial, tokens))
        self._by_serial[serial] = tokens
        self._tokens += len(tokens)
        for i in range(MIN_N, len(tokens)):
            for n in range(MIN_N, min(MAX_N, i) + 1):
                self._pos[tuple(tokens[i - n:i])] = (serial, i)
        while self._tokens > self.max_tokens:
            old, dropped = self._replies.popleft()
            del self._by_serial[old]
            self._tokens -= len(dropped)
        if len(self._pos) > 8 * (MAX_N - MIN_N + 1) * max(self._tokens, 1):
            self._pos = {k: v for k, v in self._pos.items() if v[0] in self._by_serial}

    def match(self, tokens: Sequence[int]) -> Match | None:
        """The longest n-gram ending ``tokens`` that an indexed reply holds, with the rest of
        that reply after it."""
        for n in range(min(MAX_N, len(tokens)), MIN_N - 1, -1):
            hit = self._pos.get(tuple(tokens[len(tokens) - n:]))
            if hit is not None and hit[0] in self._by_serial:
                return Match(n, self._by_serial[hit[0]], hit[1])
        return None


class ReplyStore:
    """One :class:`ReplyIndex` per namespace, the least recently used dropped past
    ``max_namespaces`` (drafts never cross namespaces)."""

    def __init__(self, max_namespaces: int, tokens_each: int) -> None:
        self.max_namespaces = max_namespaces
        self.tokens_each = tokens_each
        self._spaces: OrderedDict[str, ReplyIndex] = OrderedDict()

    def get(self, namespace: str) -> ReplyIndex | None:
        index = self._spaces.get(namespace)
        if index is not None:
            self._spaces.move_to_end(namespace)
        return index

    def add(self, namespace: str, tokens: list[int]) -> None:
        index = self.get(namespace)
        if index is None:
            index = self._spaces[namespace] = ReplyIndex(self.tokens_each)
            if len(self._spaces) > self.max_namespaces:
                self._spaces.popitem(last=False)
        index.add(tokens)
