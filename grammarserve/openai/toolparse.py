"""Incremental parser of Hermes tool calls in generated text.

``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>`` blocks become tool calls; the
text before the first block is the message content (markup never leaks into it). The parser is
fed text deltas and returns events; the non-streaming reply feeds it the whole text at once, so
streamed and non-streamed replies agree by construction (the events do not depend on how the
text was split).

Arguments are streamed as they are generated (the raw JSON text of the ``arguments`` value), so
their concatenation is exactly the ``arguments`` string of the non-streamed reply.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from grammarserve.fsm.tools import END, TRIGGER

_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')
_ALNUM = string.ascii_letters + string.digits


def new_call_id() -> str:
    return "call_" + "".join(secrets.choice(_ALNUM) for _ in range(24))


class ToolKind(str, Enum):
    """What a call calls: a function (JSON ``arguments``) or a custom tool (free-text ``input``,
    :mod:`grammarserve.openai.custom_tools`)."""

    FUNCTION = "function"
    CUSTOM = "custom"


@dataclass
class ContentDelta:
    text: str


@dataclass
class ToolCallStart:
    index: int
    id: str
    name: str
    kind: ToolKind = ToolKind.FUNCTION


@dataclass
class ToolCallArgs:
    """More of a call's arguments (a custom call's input)."""

    index: int
    text: str
    kind: ToolKind = ToolKind.FUNCTION


Event = ContentDelta | ToolCallStart | ToolCallArgs


@dataclass
class ParsedCall:
    id: str
    name: str
    arguments: str = ""  # the JSON arguments of a function call; a custom call's input
    kind: ToolKind = ToolKind.FUNCTION


class CallParser(Protocol):
    """An incremental parser of a reply into content and calls: fed text deltas with
    :meth:`feed`, then :meth:`finish` once (each returns the events of what it read)."""

    calls: list[ParsedCall]
    content: str  # the content released so far

    def feed(self, text: str) -> list[Event]: ...

    def finish(self) -> list[Event]: ...


class JsonValueEnd:
    """Finds where a JSON object/array that starts at the first character fed ends."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.done = False

    def feed(self, text: str) -> int:
        """Consume ``text``; returns how many characters belong to the value."""
        for i, ch in enumerate(text):
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.done = True
                    return i + 1
        return len(text)


@dataclass
class _Call:
    """The call being read: its text after ``<tool_call>`` and how much was streamed."""

    text: str = ""
    call: ParsedCall | None = None
    index: int = -1
    args_start: int = -1  # offset of the arguments value in ``text``
    args_sent: int = 0  # characters of the value already sent
    scanner: JsonValueEnd | None = None


@dataclass
class ToolCallParser:
    """Feed generated text with :meth:`feed`, then call :meth:`finish` once."""

    calls: list[ParsedCall] = field(default_factory=list)
    content: str = ""  # content released so far
    _buf: str = ""  # text outside calls not released yet (may start the trigger, or is space)
    _cur: _Call | None = None

    def feed(self, text: str) -> list[Event]:
        events: list[Event] = []
        while text:
            if self._cur is None:
                text = self._feed_text(text, events)
            else:
                text = self._feed_call(text, events)
        return events

    def finish(self) -> list[Event]:
        """Flush at the end of generation. A call cut off before its end (``length``) keeps
        what was streamed of it; held-back text is released unless calls were made."""
        events: list[Event] = []
        cur = self._cur
        if cur is not None:
            if cur.call is None:
                self._try_whole(cur, events, complete=False)
            self._cur = None
        elif self._buf and not self.calls:
            self._content(self._buf, events)
        self._buf = ""
        return events

    # -- outside a call --------------------------------------------------------------------
    def _feed_text(self, text: str, events: list[Event]) -> str:
        buf = self._buf + text
        i = buf.find(TRIGGER)
        if i >= 0:
            self._release(buf[:i], events, final=True)
            self._buf = ""
            self._cur = _Call()
            return buf[i + len(TRIGGER):]
        keep = _partial_suffix(buf, TRIGGER)
        self._release(buf[:len(buf) - keep], events, final=False)
        self._buf += buf[len(buf) - keep:]
        return ""

    def _release(self, text: str, events: list[Event], *, final: bool) -> None:
        """Release ``text``; trailing whitespace is held (dropped if a call follows)."""
        self._buf = ""
        body = text.rstrip()
        if final or not body:
            if body:
                self._content(body, events)
            if not final:
                self._buf = text
            return
        self._content(body, events)
        self._buf = text[len(body):]

    def _content(self, text: str, events: list[Event]) -> None:
        if text:
            self.content += text
            events.append(ContentDelta(text))

    # -- inside a call ---------------------------------------------------------------------
    def _feed_call(self, text: str, events: list[Event]) -> str:
        cur = self._cur
        assert cur is not None
        before = len(cur.text)
        cur.text += text
        end = cur.text.find(END, max(0, before - len(END) + 1))
        if cur.call is None:
            m = _HEAD.match(cur.text)
            if m and (end < 0 or m.end() <= end):
                self._start(cur, json.loads(m.group(1)), m.end(), events)
        if cur.call is not None and cur.scanner is not None and not cur.scanner.done:
            self._stream_args(cur, events, limit=end if end >= 0 else len(cur.text))
        if end < 0:
            return ""
        rest = cur.text[end + len(END):]
        cur.text = cur.text[:end]
        if cur.call is None:
            self._try_whole(cur, events, complete=True)
        elif cur.scanner is None:  # a scalar (e.g. a JSON string) is sent whole at the end
            _, value = _args_of(cur.text)
            self._args(cur, value if value is not None else "", events)
        self._cur = None
        return rest

    def _start(self, cur: _Call, name: str, args_start: int, events: list[Event]) -> None:
        call = ParsedCall(new_call_id(), name)
        cur.call, cur.index, cur.args_start = call, len(self.calls), args_start
        self.calls.append(call)
        events.append(ToolCallStart(cur.index, call.id, name))
        if cur.text[args_start:args_start + 1] in ("{", "["):
            cur.scanner = JsonValueEnd()
        elif len(cur.text) > args_start:
            cur.scanner = None
        else:  # the value has not started: decide when its first character arrives
            cur.call, cur.args_start = None, -1
            self.calls.pop()
            events.pop()

    def _stream_args(self, cur: _Call, events: list[Event], limit: int) -> None:
        assert cur.scanner is not None
        start = cur.args_start + cur.args_sent
        chunk = cur.text[start:limit]
        n = cur.scanner.feed(chunk)
        cur.args_sent += n
        self._args(cur, chunk[:n], events)

    def _args(self, cur: _Call, text: str, events: list[Event]) -> None:
        if text and cur.call is not None:
            cur.call.arguments += text
            events.append(ToolCallArgs(cur.index, text))

    def _try_whole(self, cur: _Call, events: list[Event], *, complete: bool) -> None:
        """A block whose head did not match the streaming pattern: parse it whole."""
        name, value = _args_of(cur.text)
        if name is None:
            if complete:  # not a tool call after all: keep it as text
                self._content(f"{TRIGGER}{cur.text}{END}", events)
            return
        call = ParsedCall(new_call_id(), name)
        cur.call, cur.index = call, len(self.calls)
        self.calls.append(call)
        events.append(ToolCallStart(cur.index, call.id, name))
        self._args(cur, value or "{}", events)


def _args_of(block: str) -> tuple[str | None, str | None]:
    """``(name, arguments JSON text)`` of a complete call block, or ``(None, None)``."""
    try:
        obj = json.loads(block)
    except json.JSONDecodeError:
        return None, None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None, None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        return obj["name"], args
    return obj["name"], json.dumps(args, ensure_ascii=False)


def _partial_suffix(text: str, token: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``token``."""
    for k in range(min(len(token) - 1, len(text)), 0, -1):
        if text.endswith(token[:k]):
            return k
    return 0


def parse_tool_calls(text: str) -> tuple[str | None, list[ParsedCall]]:
    """Non-streaming: ``(content or None, calls)`` of a complete output."""
    parser = ToolCallParser()
    parser.feed(text)
    parser.finish()
    content = parser.content if (parser.content or not parser.calls) else None
    return content, parser.calls
