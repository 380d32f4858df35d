"""Incremental detokenization that never emits half of a multi-byte character."""

from __future__ import annotations

from typing import Any


class IncrementalDetokenizer:
    """Feeds token ids one step at a time and returns the newly completed text.

    Decodes a small window (``prefix_offset .. end``) instead of the whole sequence, and holds
    text back while it ends in U+FFFD (an incomplete UTF-8 sequence split across tokens).
    """

    def __init__(self, tokenizer: Any, *, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens))

    def add(self, token_ids: list[int]) -> str:
        """Append tokens; return the text that became final."""
        self.token_ids.extend(token_ids)
        prefix = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.token_ids[self.prefix_offset:])
        if full.endswith("\ufffd") or len(full) <= len(prefix):
            return ""
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        return full[len(prefix):]

    def mark(self) -> tuple[int, int]:
        """The decoding offsets now (for :meth:`truncate`)."""
        return self.prefix_offset, self.read_offset

    def truncate(self, n: int, mark: tuple[int, int]) -> None:
        """Go back to the state after the first ``n`` tokens, whose :meth:`mark` was ``mark``
        (a rolled-back value check; the text returned for them stays returned)."""
        del self.token_ids[n:]
        self.prefix_offset, self.read_offset = mark

    def flush(self) -> str:
        """Text still held back (at the end of a request, even an incomplete character)."""
        prefix = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.token_ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.token_ids)
        return full[len(prefix):] if len(full) > len(prefix) else ""
