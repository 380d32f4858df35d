"""``POST /v1/responses`` replies: the ``response`` object of a finished request, and the typed
events of a streamed one (``response.created``, ``response.output_item.added``,
``response.output_text.delta``, ``response.function_call_arguments.delta`` / ``.done``,
``response.custom_tool_call_input.delta`` / ``.done``, ``response.completed``, ...), in the
shapes the ``openai`` SDK parses."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from grammarserve.engine.request import RequestOutput
from grammarserve.errors import GrammarserveError
from grammarserve.openai.context import ModelContext
from grammarserve.openai.errors import error_response
from grammarserve.openai.prepare import Prepared
from grammarserve.openai.reasoning_split import ReasoningSplitter
from grammarserve.openai.replies import OnUsage, Outputs, chat_usage, reply_parts
from grammarserve.openai.responses_request import ResponsesRequest
from grammarserve.openai.toolparse import (
    ContentDelta,
    Event,
    ParsedCall,
    ToolCallArgs,
    ToolCallStart,
    ToolKind,
)


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(totals: dict[str, Any]) -> dict[str, Any]:
    """A chat ``usage`` in the Responses shape (input / output tokens)."""
    return {"input_tokens": totals["prompt_tokens"],
            "input_tokens_details": {
                "cached_tokens": totals["prompt_tokens_details"]["cached_tokens"],
                "cache_write_tokens": 0},
            "output_tokens": totals["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": totals[
                "completion_tokens_details"]["reasoning_tokens"]},
            "total_tokens": totals["total_tokens"]}


def response_object(ctx: ModelContext, req: ResponsesRequest, prep: Prepared, *, status: str,
                    output: list[dict[str, Any]], created_at: int,
                    usage_: dict[str, Any] | None = None,
                    error: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``response`` object (``status``: in_progress, completed, incomplete or failed, with
    ``error``)."""
    fmt = req.text.format if req.text is not None else None
    tool_choice: Any = req.tool_choice or "auto"
    return {
        "id": prep.id, "object": "response", "created_at": created_at, "status": status,
        "background": False,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": None, "model": ctx.model_name, "output": output,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": None,
        "reasoning": {"effort": req.reasoning.effort if req.reasoning is not None else None,
                      "summary": None},
        "store": False,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt is not None
                 else {"type": "text"}},
        "tool_choice": tool_choice if isinstance(tool_choice, str)
        else tool_choice.model_dump(exclude_none=True),
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
        "top_p": 1.0 if req.top_p is None else req.top_p, "truncation": "disabled",
        "usage": usage_, "user": req.user, "metadata": req.metadata or {}}


def _message(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [_text_part(text)]}


def _reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    """A ``reasoning`` item: the span's text as its one ``reasoning_text`` part (no summary)."""
    return {"id": item_id, "type": "reasoning", "summary": [],
            "content": [_reasoning_part(text)], "encrypted_content": None, "status": status}


def _reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call(item_id: str, call_id: str, name: str, arguments: str, status: str
          ) -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def _custom_call(item_id: str, call_id: str, name: str, input_: str, status: str
                 ) -> dict[str, Any]:
    """A ``custom_tool_call`` item (``status`` as function calls have it; the SDK's type has
    none and keeps it as an extra field)."""
    return {"id": item_id, "type": "custom_tool_call", "call_id": call_id, "name": name,
            "input": input_, "status": status}


def _call_item(call: ParsedCall, status: str) -> dict[str, Any]:
    """The output item of a parsed call; a custom call cut by ``max_output_tokens`` is
    ``incomplete`` (its input is cut short), a function call always ``completed``."""
    if call.kind is ToolKind.CUSTOM:
        return _custom_call(_item_id("ctc"), call.id, call.name, call.arguments, status)
    return _call(_item_id("fc"), call.id, call.name, call.arguments, "completed")


def _status(out: RequestOutput) -> str:
    return "incomplete" if out.finish_reason == "length" else "completed"


def response_body(ctx: ModelContext, req: ResponsesRequest, prep: Prepared,
                  out: RequestOutput, created_at: int) -> dict[str, Any]:
    """The ``response`` of a finished request (raises the typed error of a failed one)."""
    prep.check_output(out)
    reasoning, text = reply_parts(prep, out.text)
    content: str | None = text
    calls: list[ParsedCall] = []
    if prep.tools is not None:
        content, calls = prep.tools.parse(text)
    status = _status(out)
    output = []
    if reasoning and prep.reasoning is not None and prep.reasoning.include:
        cut = status if not (content or calls) else "completed"
        output.append(_reasoning_item(_item_id("rs"), reasoning, cut))
    if (content and content.strip()) or not calls:
        output.append(_message(_item_id("msg"), content or "", status))
    output += [_call_item(c, status) for c in calls]
    return response_object(ctx, req, prep, status=status, output=output, created_at=created_at,
                           usage_=usage(chat_usage(ctx, prep, [out])))


class _EventStream:
    """Numbers the events of one stream and keeps the output items as they grow."""

    def __init__(self) -> None:
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item being written
        self.pending = ""  # whitespace before any item (held: it may precede a call)

    def event(self, type_: str, **fields: Any) -> dict[str, Any]:
        ev = {"type": type_, "sequence_number": self.seq, **fields}
        self.seq += 1
        return ev

    def add(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        self.open = item
        self.output.append(item)
        return [self.event("response.output_item.added", output_index=len(self.output) - 1,
                           item=dict(item, content=[]) if item["type"] in (
                               "message", "reasoning") else dict(item))]

    def text(self, delta: str, *, force: bool = False) -> list[dict[str, Any]]:
        """Text of the reply; opens a message item at its first non-blank text (``force``:
        even when blank)."""
        events: list[dict[str, Any]] = []
        if self.open is None or self.open["type"] != "message":
            if not force and not (self.pending + delta).strip():
                self.pending += delta
                return []
            events += self.close()
            events += self.add(_message(_item_id("msg"), "", "in_progress"))
            events.append(self._part_event("response.content_part.added", self.open, ""))
            delta, self.pending = self.pending + delta, ""
        item = self.open
        assert item is not None
        if delta:
            item["content"][0]["text"] += delta
            events.append(self.event("response.output_text.delta", item_id=item["id"],
                                     output_index=len(self.output) - 1, content_index=0,
                                     delta=delta, logprobs=[]))
        return events

    def reasoning(self, delta: str) -> list[dict[str, Any]]:
        """Text of the reasoning span (a ``reasoning`` item, opened at its first text)."""
        events: list[dict[str, Any]] = []
        if self.open is None or self.open["type"] != "reasoning":
            events += self.close()
            events += self.add(_reasoning_item(_item_id("rs"), "", "in_progress"))
            events.append(self.event("response.content_part.added", item_id=self.output[-1]["id"],
                                     output_index=len(self.output) - 1, content_index=0,
                                     part=_reasoning_part("")))
        item = self.open
        assert item is not None
        item["content"][0]["text"] += delta
        events.append(self.event("response.reasoning_text.delta", item_id=item["id"],
                                 output_index=len(self.output) - 1, content_index=0,
                                 delta=delta))
        return events

    def _part_event(self, type_: str, item: dict[str, Any] | None, text: str
                    ) -> dict[str, Any]:
        assert item is not None
        return self.event(type_, item_id=item["id"], output_index=len(self.output) - 1,
                          content_index=0, part=_text_part(text))

    def call(self, ev: ToolCallStart) -> list[dict[str, Any]]:
        if ev.kind is ToolKind.CUSTOM:
            item = _custom_call(_item_id("ctc"), ev.id, ev.name, "", "in_progress")
        else:
            item = _call(_item_id("fc"), ev.id, ev.name, "", "in_progress")
        return self.close() + self.add(item)

    def arguments(self, delta: str) -> list[dict[str, Any]]:
        """More of the open call's arguments (a custom call's input)."""
        item = self.open
        assert item is not None and item["type"] in ("function_call", "custom_tool_call")
        custom = item["type"] == "custom_tool_call"
        item["input" if custom else "arguments"] += delta
        return [self.event("response.custom_tool_call_input.delta" if custom
                           else "response.function_call_arguments.delta", item_id=item["id"],
                           output_index=len(self.output) - 1, delta=delta)]

    def close(self, status: str = "completed") -> list[dict[str, Any]]:
        """Finish the open item (its ``.done`` events)."""
        item, self.open = self.open, None
        if item is None:
            return []
        index = len(self.output) - 1
        item["status"] = status
        if item["type"] == "reasoning":
            text = item["content"][0]["text"]
            events = [self.event("response.reasoning_text.done", item_id=item["id"],
                                 output_index=index, content_index=0, text=text),
                      self.event("response.content_part.done", item_id=item["id"],
                                 output_index=index, content_index=0,
                                 part=_reasoning_part(text))]
        elif item["type"] == "message":
            text = item["content"][0]["text"]
            events = [self.event("response.output_text.done", item_id=item["id"],
                                 output_index=index, content_index=0, text=text, logprobs=[]),
                      self._part_event("response.content_part.done", item, text)]
        elif item["type"] == "custom_tool_call":
            events = [self.event("response.custom_tool_call_input.done", item_id=item["id"],
                                 output_index=index, input=item["input"])]
        else:
            events = [self.event("response.function_call_arguments.done", item_id=item["id"],
                                 output_index=index, name=item["name"],
                                 arguments=item["arguments"])]
        return [*events, self.event("response.output_item.done", output_index=index,
                                    item=dict(item))]


def _apply(s: _EventStream, ev: Event) -> list[dict[str, Any]]:
    if isinstance(ev, ContentDelta):
        return s.text(ev.text)
    if isinstance(ev, ToolCallStart):
        return s.call(ev)
    assert isinstance(ev, ToolCallArgs)
    return s.arguments(ev.text)


async def response_events(ctx: ModelContext, req: ResponsesRequest, prep: Prepared,
                          outputs: Outputs, on_usage: OnUsage | None = None
                          ) -> AsyncIterator[dict[str, Any]]:
    """The typed events of a streamed response (the caller frames them as SSE). A request that
    fails in the engine ends with an ``error`` event and ``response.failed``."""
    created = int(time.time())
    s = _EventStream()
    start = response_object(ctx, req, prep, status="in_progress", output=[], created_at=created)
    yield s.event("response.created", response=start)
    yield s.event("response.in_progress", response=start)
    parser = prep.tools.parser() if prep.tools is not None else None
    plan = prep.reasoning
    splitter = ReasoningSplitter(plan.format, opened=plan.opened) if plan is not None else None
    final: RequestOutput | None = None
    try:
        async with aclosing(outputs) as it:  # type: ignore[type-var]
            async for _, out in it:
                thought, delta = "", out.delta_text
                if splitter is not None:
                    thought, delta = splitter.step(delta, last=out.finished)
                if thought and plan is not None and plan.include:
                    for item in s.reasoning(thought):
                        yield item
                if parser is None:
                    events: list[Event] = [ContentDelta(delta)] if delta else []
                else:
                    events = parser.feed(delta) + (parser.finish() if out.finished else [])
                for ev in events:
                    for item in _apply(s, ev):
                        yield item
                if out.finished:
                    final = out
    except GrammarserveError as failure:
        status_code, body = error_response(failure)
        err = body["error"]
        yield s.event("error", code=err["code"] or err["type"], message=err["message"],
                      param=err["param"])
        code = "server_error" if status_code >= 500 else "invalid_prompt"
        if s.open is not None:  # the item being written stays unfinished
            s.open["status"] = "incomplete"
        yield s.event("response.failed", response=response_object(
            ctx, req, prep, status="failed", output=s.output, created_at=created,
            error={"code": code, "message": err["message"]}))
        return
    assert final is not None
    status = _status(final)
    if all(item["type"] == "reasoning" for item in s.output):
        # NOTE: a blank reply is one message, as when not streamed (after its reasoning)
        if s.open is not None:
            for e in s.close(status):
                yield e
        for e in s.text("", force=True):
            yield e
    # NOTE: as not streamed: a message, a custom call or a reasoning item cut short is
    # incomplete
    cut = s.open is not None and s.open["type"] in ("message", "custom_tool_call", "reasoning")
    for e in s.close(status if cut else "completed"):
        yield e
    totals = chat_usage(ctx, prep, [final])
    if on_usage is not None:
        on_usage(totals)
    done = response_object(ctx, req, prep, status=status, output=s.output, created_at=created,
                           usage_=usage(totals))
    yield s.event("response.completed" if status == "completed" else "response.incomplete",
                  response=done)
