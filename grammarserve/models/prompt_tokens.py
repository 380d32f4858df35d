"""Prompt tokenization with the text between added tokens cached.

A fast (Rust) Hugging Face tokenizer first splits its input at its added tokens (``<|im_start|>``
...) and then normalizes, pre-tokenizes and runs the model on each piece apart, so the ids of a
text are the ids of its pieces in order: a piece seen before (the tool list of an agent's every
request, ~5k tokens, ~9 ms to tokenize) can come from a cache. A :class:`SegmentEncoder` (one
per tokenizer, owned by the engine and by the protocol layer's ``ModelContext``) keeps the
ids of long pieces in an LRU; it tokenizes in one call as before for a tokenizer
where that split is not exact (an added token that strips spaces or matches single words, a
normalizer in front of normalized added tokens, a ``Metaspace`` pre-tokenizer, which prefixes
the first piece only), and for one that fails a check on a probe text at first use.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any

MIN_CHARS = 256  # shorter pieces are tokenized each time (cheap, and they would crowd the LRU)
MAX_ENTRIES = 64
MAX_CHARS = 4_000_000  # characters of text behind the cached pieces, in all
_PROBE = ("You are a helpful assistant.<|X|>\n  two  spaces\t<|X|><|X|> é 日本 'quotes' "
          "x<|X|>y\n\n<|X|> trailing ")


class SegmentEncoder:
    """``encode(text)``: the tokenizer's ``encode(text, add_special_tokens=False)``, the ids of
    long pieces between added tokens from an LRU (see the module docstring)."""

    def __init__(self, tokenizer: Any, *, min_chars: int = MIN_CHARS,
                 max_entries: int = MAX_ENTRIES, max_chars: int = MAX_CHARS) -> None:
        self.tokenizer = tokenizer
        self.min_chars, self.max_entries, self.max_chars = min_chars, max_entries, max_chars
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()
        self.hits = 0
        self._ids: dict[str, int] = {}
        self._split: re.Pattern[str] | None = None
        added = _splittable_added_tokens(tokenizer)
        if added:
            self._ids = added
            self._split = re.compile("|".join(
                re.escape(t) for t in sorted(added, key=len, reverse=True)))
            if not self._probe_ok():
                self._split = None

    @property
    def enabled(self) -> bool:
        return self._split is not None

    def encode(self, text: str) -> list[int]:
        if self._split is None:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        pieces: list[str | int] = []  # text pieces and added-token ids, in order
        pos = 0
        for m in self._split.finditer(text):
            if m.start() > pos:
                pieces.append(text[pos:m.start()])
            pieces.append(self._ids[m.group()])
            pos = m.end()
        if pos < len(text):
            pieces.append(text[pos:])
        with self._lock:
            known = {p: self._cache[p] for p in pieces if isinstance(p, str) and p in self._cache}
            for p in known:
                self._cache.move_to_end(p)
            self.hits += len(known)
        todo = list(dict.fromkeys(p for p in pieces if isinstance(p, str) and p not in known))
        if todo:
            fresh = self.tokenizer(todo, add_special_tokens=False)["input_ids"]
            known.update(zip(todo, fresh))
            self._keep({p: ids for p, ids in zip(todo, fresh) if len(p) >= self.min_chars})
        out: list[int] = []
        for piece in pieces:
            if isinstance(piece, int):
                out.append(piece)
            else:
                out.extend(known[piece])
        return out

    def _keep(self, new: dict[str, list[int]]) -> None:
        with self._lock:
            for piece, ids in new.items():
                if piece in self._cache or len(piece) > self.max_chars:
                    continue
                self._cache[piece] = list(ids)
                self._chars += len(piece)
            while self._cache and (len(self._cache) > self.max_entries
                                   or self._chars > self.max_chars):
                piece, _ = self._cache.popitem(last=False)
                self._chars -= len(piece)

    def _probe_ok(self) -> bool:
        """Pieces tokenized apart give the one-call ids on a probe with every added token."""
        probe = "".join(_PROBE.replace("<|X|>", t) for t in self._ids)
        saved, self.min_chars = self.min_chars, 0
        try:
            return self.encode(probe) == list(self.tokenizer.encode(
                probe, add_special_tokens=False))
        finally:
            self.min_chars = saved
            with self._lock:
                self._cache.clear()
                self._chars = 0
                self.hits = 0


def _splittable_added_tokens(tokenizer: Any) -> dict[str, int]:
    """The added tokens' text -> id where splitting at them first is exact, else {}."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(tokenizer, "added_tokens_decoder", None)
    if backend is None or not decoder or getattr(tokenizer, "split_special_tokens", False):
        return {}
    if "Metaspace" in repr(backend.pre_tokenizer):
        return {}
    has_normalizer = backend.normalizer is not None
    out: dict[str, int] = {}
    for tid, tok in decoder.items():
        if tok.lstrip or tok.rstrip or tok.single_word or (tok.normalized and has_normalizer):
            return {}
        if tok.content:
            out[tok.content] = int(tid)
    return out
