"""Token texts for logprobs: token id -> (text, UTF-8 bytes), in the shapes chat and completions
report them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grammarserve.engine.sampler import TopEntry
from grammarserve.fsm.vocab import byte_level_chars


class TokenTexts:
    """Token id -> (text, UTF-8 bytes) for logprobs, cached per id.

    Byte-level BPE tokens are mapped back to their exact bytes (a token may hold part of a
    multi-byte character); other tokenizers fall back to decoding the single token.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}
        self._byte_decoder = {ch: b for b, ch in byte_level_chars().items()}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            raw = self.tokenizer.convert_ids_to_tokens(token_id)
            if isinstance(raw, str) and raw and all(c in self._byte_decoder for c in raw):
                data = bytes(self._byte_decoder[c] for c in raw)
                hit = (data.decode("utf-8", errors="replace"), list(data))
            else:
                text = self.tokenizer.decode([token_id])
                hit = (text, list(text.encode("utf-8")))
            self._cache[token_id] = hit
        return hit

    def chat_logprobs(self, token_ids: list[int], logprobs: list[float],
                      tops: Sequence[Sequence[TopEntry]] = ()) -> list[dict[str, Any]]:
        """Chat ``logprobs.content``: one entry per token; ``tops[i]`` (token id, logprob)
        pairs become its ``top_logprobs`` (``[]`` when the request asked for none)."""
        out = []
        for i, (tid, lp) in enumerate(zip(token_ids, logprobs)):
            text, data = self.get(tid)
            top = []
            for alt, x in (tops[i] if i < len(tops) else ()):
                alt_text, alt_data = self.get(alt)
                top.append({"token": alt_text, "logprob": x, "bytes": alt_data})
            out.append({"token": text, "logprob": lp, "bytes": data, "top_logprobs": top})
        return out

    def completion_logprobs(self, token_ids: list[int], logprobs: list[float], offset: int,
                            tops: Sequence[Sequence[TopEntry]] | None = None) -> dict[str, Any]:
        """Completions ``logprobs``; ``top_logprobs`` is a ``{token: logprob}`` dict per token
        when ``tops`` is given (a text two alternatives share keeps the likelier), else null."""
        tokens = [self.get(t)[0] for t in token_ids]
        offsets = []
        for t in tokens:
            offsets.append(offset)
            offset += len(t)
        top: list[dict[str, float]] | None = None
        if tops is not None:
            top = []
            for i in range(len(tokens)):
                entry: dict[str, float] = {}
                for alt, x in (tops[i] if i < len(tops) else ()):
                    entry.setdefault(self.get(alt)[0], x)
                top.append(entry)
        return {"tokens": tokens, "token_logprobs": list(logprobs), "top_logprobs": top,
                "text_offset": offsets}
