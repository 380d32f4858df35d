"""The one incremental parser of tool calls, driven by a row of the formats table
(:mod:`grammarserve.fsm.tool_formats`).

The reply is plain text (the message content) until the calls start: at the first trigger for
formats whose trigger may come anywhere (the text before it is the content, its trailing
whitespace dropped; markup never leaks into it), or at the reply's start for the others
(``llama3_json``'s ``{`` or ``<|python_tag|>``, pythonic's ``[``, a JSON array's ``[``). The
calls are then read piece by piece as the table spells them: list open, call open, the name (a
JSON string under ``name_key``, or the text up to ``name_close``), the arguments (a decoder per
encoding, :mod:`grammarserve.openai.toolparse_args`), call close, separator or list close.
Whitespace is allowed before each piece. A call starts (:class:`ToolCallStart`) as soon as its
name is complete, and its arguments stream as they are decoded (:class:`ToolCallArgs`).

Fed text deltas, the parser returns events; the non-streaming reply feeds it the whole text at
once, so streamed and non-streamed replies agree by construction. A JSON call object whose keys
come in another order is parsed whole when it closes. A reply cut inside a call keeps what was
streamed of it; calls text that is no call at all (with no call before it) is content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from enum import Enum
from typing import Any

from grammarserve.fsm.json_lex import JsonValueEnd
from grammarserve.fsm.tool_formats import ToolFormat
from grammarserve.openai.toolparse import (
    ContentDelta,
    Event,
    ParsedCall,
    ToolCallArgs,
    ToolCallStart,
    new_call_id,
)
from grammarserve.openai.toolparse_args import ArgsDecoder, decoder

_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_STR = r'"(?:[^"\\]|\\.)*"'


class _At(Enum):
    """Where the parser is in the calls."""

    OPEN = "open"  # before the list's opening
    CALL = "call"  # before a call's opening
    NAME = "name"
    ARGS = "args"
    AFTER = "after"  # after the arguments: the JSON call object's ``}``
    CLOSE = "close"  # the call's close
    BETWEEN = "between"  # after a call: separator, or the list's close
    DONE = "done"


class FormatParser:
    """Feed generated text with :meth:`feed`, then call :meth:`finish` once.

    ``tools`` maps each tool's name to its ``parameters`` schema (XML values are decoded by
    their type); unknown tools decode by their text.
    """

    def __init__(self, fmt: ToolFormat, tools: Mapping[str, dict[str, Any]] | None = None
                 ) -> None:
        self.fmt = fmt
        self.tools = dict(tools or {})
        self.calls: list[ParsedCall] = []
        self.content = ""
        self._starts = fmt.triggers or (fmt.opening,)
        self._anywhere = fmt.trigger_anywhere and bool(fmt.triggers)
        self._buf = ""  # text outside the calls, not released yet
        self._text_only = False  # the reply is plain text (at-start formats)
        self._region: str | None = None  # the calls' text, from the trigger on
        self._pos = 0
        self._at = _At.OPEN
        self._failed = False  # the region is no calls
        self._call: ParsedCall | None = None
        self._args: ArgsDecoder | None = None
        self._whole: JsonValueEnd | None = None  # a JSON call object read whole
        self._whole_start = self._whole_end = 0  # its start, and how far it was scanned
        self._head = re.compile(r"\s*\{\s*\"(?:" + re.escape(fmt.name_key or "name") + r")\"\s*:"
                                r"\s*(" + _STR + r")\s*,\s*\"(?:arguments|parameters)\"\s*:")

    # -- feeding -----------------------------------------------------------------------------
    def feed(self, text: str) -> list[Event]:
        events: list[Event] = []
        if self._region is not None:
            self._region += text
            self._advance(events)
        elif self._text_only:
            self._content(text, events)
        elif self._anywhere:
            self._feed_anywhere(text, events)
        else:
            self._feed_at_start(text, events)
        return events

    def finish(self) -> list[Event]:
        """Flush at the end of generation."""
        events: list[Event] = []
        if self._region is None:
            if self._buf and not self.calls:
                self._content(self._buf, events)
        else:
            if self._whole is not None and not self._failed:
                self._parse_whole(events, complete=False)
            if not self.calls and (self._failed or not self._anywhere):
                self._content(self._buf + self._region, events)
        self._buf = ""
        return events

    def _feed_anywhere(self, text: str, events: list[Event]) -> None:
        buf, trigger = self._buf + text, self._starts[0]
        i = buf.find(trigger)
        if i >= 0:
            body = buf[:i].rstrip()
            self._content(body, events)
            self._buf = ""
            self._enter(buf[i:], events)
            return
        keep = _partial_suffix(buf, trigger)
        body = buf[:len(buf) - keep]
        shown = body.rstrip()  # NOTE: trailing whitespace is held: dropped if a call follows
        self._content(shown, events)
        self._buf = buf[len(shown):]

    def _feed_at_start(self, text: str, events: list[Event]) -> None:
        buf = self._buf + text
        lead = buf.lstrip()
        if any(lead.startswith(s) for s in self._starts):
            self._buf = buf[:len(buf) - len(lead)]
            self._enter(lead, events)
        elif not lead or any(s.startswith(lead) for s in self._starts):
            self._buf = buf
        else:
            self._buf, self._text_only = "", True
            self._content(buf, events)

    def _enter(self, region: str, events: list[Event]) -> None:
        self._region, self._pos = region, 0
        self._at = _At.OPEN if self.fmt.list_open else _At.CALL
        self._advance(events)

    def _content(self, text: str, events: list[Event]) -> None:
        if text:
            self.content += text
            events.append(ContentDelta(text))

    # -- the calls ---------------------------------------------------------------------------
    def _advance(self, events: list[Event]) -> None:
        while self._at is not _At.DONE:
            moved = self._step(events)
            if moved is None:  # more text needed
                return
            if moved is False:
                self._failed = not self.calls and self._call is None
                self._at = _At.DONE

    def _lit(self, literal: str) -> bool | None:
        """Consume ``literal`` (its whitespace-stripped form, after any whitespace)."""
        assert self._region is not None
        want = literal.strip()
        pos = self._pos
        while pos < len(self._region) and self._region[pos].isspace():
            pos += 1
        have = self._region[pos:pos + len(want)]
        if have == want:
            self._pos = pos + len(want)
            return True
        return None if want.startswith(have) else False

    def _step(self, events: list[Event]) -> bool | None:
        fmt, at = self.fmt, self._at
        if at is _At.OPEN:
            opened = self._lit(fmt.list_open)
            if opened is False and fmt.open_optional:
                opened = True
            if opened:
                self._at = _At.CALL
            return opened
        if at is _At.CALL:
            opened = self._lit(fmt.call_open) if fmt.call_open else True
            if opened:
                self._at = _At.NAME
            return opened
        if at is _At.NAME:
            return self._name(events)
        if at is _At.ARGS:
            return self._read_args(events)
        if at is _At.AFTER:
            done = self._lit("}") if fmt.name_key is not None and self._whole is None else True
            if done:
                self._at = _At.CLOSE
            return done
        if at is _At.CLOSE:
            closed = self._lit(fmt.call_close) if fmt.call_close else True
            if closed:
                self._call, self._args, self._whole = None, None, None
                self._at = _At.DONE if fmt.single else _At.BETWEEN
            return closed
        # BETWEEN
        if fmt.list_close:
            closed = self._lit(fmt.list_close)
            if closed:
                self._at = _At.DONE
                return True
            if closed is None:
                return None
        if fmt.sep.strip():
            sep = self._lit(fmt.sep)
            if sep:
                self._at = _At.CALL
            return sep
        self._at = _At.CALL
        return True

    def _name(self, events: list[Event]) -> bool | None:
        region = self._region
        assert region is not None
        if self.fmt.name_key is not None:
            m = self._head.match(region, self._pos)
            if m is not None:  # NOTE: the usual head, maybe only now complete
                self._whole = None
                self._start(json.loads(m.group(1)), events)
                self._pos = m.end()
                return True
            if self._whole is not None:
                return self._parse_whole(events, complete=True)
            start = self._pos
            while start < len(region) and region[start].isspace():
                start += 1
            if start >= len(region):
                return None
            if region[start] != "{":
                return False
            self._whole, self._whole_start, self._whole_end = JsonValueEnd(), start, start
            return self._parse_whole(events, complete=True)
        while self._pos < len(region) and region[self._pos].isspace():
            self._pos += 1
        m = _NAME.match(region, self._pos)
        if m is None:
            return None if self._pos >= len(region) else False
        if m.end() == len(region):
            return None
        self._pos = m.end()
        closed = self._lit(self.fmt.name_close) if self.fmt.name_close.strip() else True
        if closed is not True:
            self._pos = m.start()
            return closed
        self._start(m.group(0), events)
        return True

    def _start(self, name: str, events: list[Event]) -> None:
        call = ParsedCall(new_call_id(), name)
        self.calls.append(call)
        self._call = call
        self._args = decoder(self.fmt.args, self.tools.get(name))
        self._at = _At.ARGS
        events.append(ToolCallStart(len(self.calls) - 1, call.id, name))

    def _read_args(self, events: list[Event]) -> bool | None:
        assert self._region is not None and self._args is not None
        pos, pieces, done = self._args.step(self._region, self._pos)
        self._pos = pos
        for piece in pieces:
            self._arg(piece, events)
        if done:
            self._at = _At.AFTER
        return done

    def _arg(self, text: str, events: list[Event]) -> None:
        if text and self._call is not None:
            self._call.arguments += text
            events.append(ToolCallArgs(len(self.calls) - 1, text))

    def _parse_whole(self, events: list[Event], *, complete: bool) -> bool | None:
        """A JSON call object that did not start the usual way: read it whole."""
        region, whole = self._region, self._whole
        assert region is not None and whole is not None
        if not whole.done:
            self._whole_end += whole.feed(region[self._whole_end:])
            if not whole.done and complete:
                return None
        end = self._whole_end
        try:
            obj = json.loads(region[self._whole_start:end])
        except json.JSONDecodeError:
            return False
        if not isinstance(obj, dict) or not isinstance(obj.get(self.fmt.name_key), str):
            return False
        self._start(obj[self.fmt.name_key], events)
        args = obj.get("arguments", obj.get("parameters", {}))
        self._arg(args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
                  events)
        self._pos, self._at = end, _At.AFTER
        return True


def _partial_suffix(text: str, token: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``token``."""
    for k in range(min(len(token) - 1, len(text)), 0, -1):
        if text.endswith(token[:k]):
            return k
    return 0
