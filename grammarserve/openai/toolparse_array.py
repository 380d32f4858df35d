"""Incremental parser of the ``json_array`` tool-call format, and the parser of each format.

``[{"name": "f", "parameters": {...}}, ...]`` becomes tool calls, with the same events as the
Hermes parser (:mod:`grammarserve.openai.toolparse`): a call starts when its name is known and its
arguments (the raw JSON text of ``parameters``) stream as they are generated, so streamed and
non-streamed replies agree. An array whose ``]`` never came (the reply ended at a repeated call,
or at ``max_tokens``) still yields its complete calls. Text that is no array is content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from grammarserve.openai.toolparse import (
    CallParser,
    ContentDelta,
    Event,
    JsonValueEnd,
    ParsedCall,
    ToolCallArgs,
    ToolCallParser,
    ToolCallStart,
    new_call_id,
)

_HEAD = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"parameters"\s*:\s*')


@dataclass
class JsonArrayParser:
    """Feed generated text with :meth:`feed`, then call :meth:`finish` once."""

    calls: list[ParsedCall] = field(default_factory=list)
    content: str = ""
    _text: str = ""
    _pos: int = 0  # characters of ``_text`` scanned
    _depth: int = 0
    _in_string: bool = False
    _escape: bool = False
    _elem: int = -1  # start of the element being read (-1: between elements)
    _call: ParsedCall | None = None
    _args_start: int = -1
    _args_sent: int = 0
    _scanner: JsonValueEnd | None = None
    _not_array: bool = False

    def feed(self, text: str) -> list[Event]:
        events: list[Event] = []
        self._text += text
        if not self._not_array and self._text.strip() and not self._text.lstrip().startswith("["):
            self._not_array = True
        if self._not_array:
            return events
        while self._pos < len(self._text):
            self._step(self._text[self._pos], events)
            self._pos += 1
        if self._call is not None:
            self._stream_args(events)
        return events

    def finish(self) -> list[Event]:
        """Flush at the end of generation: text that was no array of calls is content."""
        events: list[Event] = []
        if (self._not_array or not self.calls) and self._text and not self.content:
            self.content = self._text
            events.append(ContentDelta(self._text))
        return events

    def _step(self, ch: str, events: list[Event]) -> None:
        if self._elem >= 0 and self._args_start < 0 and not self._in_string \
                and not ch.isspace():
            self._try_head(events)
        if self._in_string:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"':
                self._in_string = False
            return
        if ch == '"':
            self._in_string = True
        elif ch in "{[":
            self._depth += 1
            if self._depth == 2 and ch == "{":
                self._elem = self._pos
        elif ch in "}]":
            self._depth -= 1
            if self._depth == 1 and self._elem >= 0:
                self._close(events)

    def _try_head(self, events: list[Event]) -> None:
        """At the first character of a value: if it is the ``parameters`` value, start the
        call."""
        m = _HEAD.fullmatch(self._text, self._elem, self._pos)
        if m is None:
            return
        self._args_start = self._pos
        self._call = ParsedCall(new_call_id(), json.loads(m.group(1)))
        self.calls.append(self._call)
        events.append(ToolCallStart(len(self.calls) - 1, self._call.id, self._call.name))

    def _stream_args(self, events: list[Event]) -> None:
        call, start = self._call, self._args_start + self._args_sent
        assert call is not None
        if self._scanner is None:
            if self._text[self._args_start:self._args_start + 1] not in ("{", "["):
                return  # not started, or a scalar: sent whole when the element closes
            self._scanner = JsonValueEnd()
        if self._scanner.done:
            return
        chunk = self._text[start:min(self._pos, len(self._text))]
        n = self._scanner.feed(chunk)
        self._args_sent += n
        if chunk[:n]:
            call.arguments += chunk[:n]
            events.append(ToolCallArgs(len(self.calls) - 1, chunk[:n]))

    def _close(self, events: list[Event]) -> None:
        """The element ending at ``_pos`` closed: finish its call (or parse it whole)."""
        end = self._pos + 1
        if self._call is not None:
            self._stream_args(events)
        try:
            obj = json.loads(self._text[self._elem:end])
        except json.JSONDecodeError:
            obj = None
        if self._call is None and isinstance(obj, dict) and isinstance(obj.get("name"), str):
            self._call = ParsedCall(new_call_id(), obj["name"])
            self.calls.append(self._call)
            events.append(ToolCallStart(len(self.calls) - 1, self._call.id, self._call.name))
        call = self._call
        if call is not None and not call.arguments:
            args = obj.get("parameters", obj.get("arguments", {})) if isinstance(obj, dict) else {}
            call.arguments = args if isinstance(args, str) else json.dumps(args,
                                                                           ensure_ascii=False)
            events.append(ToolCallArgs(len(self.calls) - 1, call.arguments))
        self._elem, self._call, self._args_start, self._args_sent = -1, None, -1, 0
        self._scanner = None


ToolParser = ToolCallParser | JsonArrayParser


def make_parser(fmt: str) -> ToolParser:
    """The incremental parser of tool-call format ``fmt`` (``"hermes"`` or ``"json_array"``)."""
    return JsonArrayParser() if fmt == "json_array" else ToolCallParser()


def parse_calls(text: str, fmt: str = "hermes") -> tuple[str | None, list[ParsedCall]]:
    """Non-streaming: ``(content or None, calls)`` of a complete output in format ``fmt``."""
    return parse_with(make_parser(fmt), text)


def parse_with(parser: CallParser, text: str
               ) -> tuple[str | None, list[ParsedCall]]:
    """Non-streaming: ``(content or None, calls)`` of a complete output, read by ``parser``
    (a new one)."""
    parser.feed(text)
    parser.finish()
    content = parser.content if (parser.content or not parser.calls) else None
    return content, parser.calls
