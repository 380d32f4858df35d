"""What the grammar layer needs to know about a tokenizer: size, stop tokens and a fingerprint."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any


@dataclass(frozen=True)
class VocabInfo:
    """Tokenizer facts shared by every backend.

    Attributes
    ----------
    tokenizer : Any
        The Hugging Face (fast) tokenizer.
    vocab_size : int
        Logits width the bitmask covers (``>= len(tokenizer)``).
    stop_token_ids : tuple[int, ...]
        Tokens that end generation; the mask allows them exactly where the grammar may end.
    fingerprint : str
        Hash of the vocabulary, the stop tokens and ``vocab_size`` (part of every cache key).
    special_token_ids : tuple[int, ...]
        The tokenizer's special (control) tokens, stop tokens included: no text, so no grammar
        may allow one inside the output (the detokenizer drops them).
    """

    tokenizer: Any = field(repr=False, compare=False)
    vocab_size: int
    stop_token_ids: tuple[int, ...]
    fingerprint: str
    special_token_ids: tuple[int, ...] = ()

    @property
    def bitmask_width(self) -> int:
        """Number of int32 words per bitmask row: ``ceil(vocab_size / 32)``."""
        return (self.vocab_size + 31) // 32

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, *, vocab_size: int | None = None,
                       stop_token_ids: list[int] | None = None) -> VocabInfo:
        """Build from a Hugging Face tokenizer.

        Parameters
        ----------
        tokenizer : transformers.PreTrainedTokenizerFast
            The model's tokenizer.
        vocab_size : int, optional
            The model's logits width; defaults to ``len(tokenizer)``.
        stop_token_ids : list[int], optional
            Defaults to the tokenizer's ``eos_token_id``.
        """
        n = len(tokenizer)
        size = n if vocab_size is None else int(vocab_size)
        if size < n:
            raise ValueError(f"vocab_size={size} is smaller than the tokenizer ({n} tokens); pass "
                             "the model's logits width")
        if stop_token_ids is None:
            eos = getattr(tokenizer, "eos_token_id", None)
            if eos is None:
                raise ValueError("the tokenizer has no eos_token_id; pass stop_token_ids=[...]")
            stop_token_ids = [int(eos)]
        stops = tuple(sorted({int(t) for t in stop_token_ids}))
        for t in stops:
            if not 0 <= t < size:
                raise ValueError(f"stop token id {t} is outside the vocabulary [0, {size})")
        digest = hashlib.sha256()
        for token, idx in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
            digest.update(f"{idx}\x00{token}\x01".encode("utf-8", "surrogatepass"))
        special = {int(i) for i in getattr(tokenizer, "all_special_ids", ())} | {
            int(i) for i, added in getattr(tokenizer, "added_tokens_decoder", {}).items()
            if getattr(added, "special", False)}
        specials = tuple(sorted(i for i in special if 0 <= i < size))
        digest.update(f"|{size}|{stops}|{specials}".encode())
        return cls(tokenizer=tokenizer, vocab_size=size, stop_token_ids=stops,
                   fingerprint=digest.hexdigest()[:32], special_token_ids=specials)


@lru_cache(maxsize=1)
def byte_level_chars() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, the alphabet of byte-level BPE
    vocabularies (read-only: the cached dict is shared)."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
            + list(range(ord("®"), ord("ÿ") + 1)))
    chars = list(keep)
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(keep, (chr(c) for c in chars)))
