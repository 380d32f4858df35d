"""Chat and text completion bodies and stream chunks (reference/openai-api.md §2), usage and
ids."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from grammarserve.engine.request import RequestOutput
from grammarserve.openai.toolparse import ParsedCall, ToolCallArgs, ToolCallStart, ToolKind


def new_id(prefix: str, *, sep: str = "-") -> str:
    """OpenAI-style ids: ``chatcmpl-...``, ``cmpl-...``; with ``sep="_"``: ``resp_...``,
    ``batch_req_...``; ``file-...``."""
    return f"{prefix}{sep}{uuid.uuid4().hex}"


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
    return [{"id": c.id, "type": "custom", "custom": {"name": c.name, "input": c.arguments}}
            if c.kind is ToolKind.CUSTOM else
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def tool_call_delta(ev: ToolCallStart | ToolCallArgs) -> dict[str, Any]:
    """A chat chunk's ``tool_calls`` item: a call's start (id, type, name) or more of its
    arguments; a custom call's as ``{"type": "custom", "custom": {"name", "input"}}``, the
    shape of its non-streamed call (the SDK keeps ``custom`` as a dict: its chunk type knows
    function calls only)."""
    if isinstance(ev, ToolCallStart):
        body = "custom" if ev.kind is ToolKind.CUSTOM else "function"
        key = "input" if ev.kind is ToolKind.CUSTOM else "arguments"
        return {"index": ev.index, "id": ev.id, "type": body, body: {"name": ev.name, key: ""}}
    if ev.kind is ToolKind.CUSTOM:
        return {"index": ev.index, "custom": {"input": ev.text}}
    return {"index": ev.index, "function": {"arguments": ev.text}}


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


def dumps(obj: Any) -> str:
    """Compact JSON, non-ASCII kept (SSE events, result lines)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
