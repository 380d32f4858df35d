"""Response bodies and stream chunks in the shapes of reference/openai-api.md §2."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from grammarserve.engine.request import RequestOutput
from grammarserve.engine.sampler import TopEntry
from grammarserve.server.toolparse import ParsedCall


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class TokenTexts:
    """Token id -> (text, UTF-8 bytes) for logprobs, cached per id.

    Byte-level BPE tokens are mapped back to their exact bytes (a token may hold part of a
    multi-byte character); other tokenizers fall back to decoding the single token.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}
        self._byte_decoder = {ch: b for b, ch in _bytes_to_unicode().items()}

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


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte <-> printable character map used by byte-level BPE."""
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


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": 0}}


def final_usage(outs: list[RequestOutput], num_prompts: int = 1) -> dict[str, Any]:
    """Usage of a request's choices; each prompt is counted once (n choices share it)."""
    per_prompt = max(1, len(outs) // max(1, num_prompts))
    firsts = outs[::per_prompt]
    return usage(sum(len(o.prompt_token_ids) for o in firsts),
                 sum(len(o.token_ids) for o in outs),
                 sum(o.num_cached_tokens for o in firsts))


def tool_call_dicts(calls: list[ParsedCall]) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def finish_reason(engine_reason: str | None, has_calls: bool) -> str:
    if engine_reason == "length":
        return "length"
    return "tool_calls" if has_calls else "stop"


def chat_completion(rid: str, model: str, choices: list[dict[str, Any]],
                    usage_: dict[str, Any]) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "system_fingerprint": None, "choices": choices, "usage": usage_}


def chat_choice(index: int, content: str | None, calls: list[ParsedCall], reason: str,
                logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if calls:
        message["tool_calls"] = tool_call_dicts(calls)
    return {"index": index, "message": message, "finish_reason": reason,
            "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None}}


class ChunkMaker:
    """Builds the ``chat.completion.chunk`` / ``text_completion`` events of one stream."""

    def __init__(self, rid: str, model: str, *, chat: bool, include_usage: bool) -> None:
        self.base = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                     "created": int(time.time()), "model": model, "system_fingerprint": None}
        self.include_usage = include_usage

    def _wrap(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        chunk = dict(self.base, choices=choices)
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def delta(self, index: int, delta: dict[str, Any], *, reason: str | None = None,
              logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return self._wrap([{"index": index, "delta": delta, "finish_reason": reason,
                            "logprobs": None if logprobs is None else
                            {"content": logprobs, "refusal": None}}])

    def text(self, index: int, text: str, *, reason: str | None = None,
             logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._wrap([{"index": index, "text": text, "finish_reason": reason,
                            "logprobs": logprobs}])

    def usage(self, usage_: dict[str, Any]) -> dict[str, Any]:
        return dict(self.base, choices=[], usage=usage_)


def completion(rid: str, model: str, choices: list[dict[str, Any]],
               usage_: dict[str, Any]) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "system_fingerprint": None, "choices": choices, "usage": usage_}


def error_body(message: str, *, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
