"""The events and calls of tool-call parsing, shared by every parser of a reply.

A parser (:class:`CallParser`: the one table-driven parser of
:mod:`grammarserve.openai.toolparse_format`, or a custom tool's input) is fed text deltas and
returns :data:`Event` values: content, a call's start (its id and name), more of its arguments.
The non-streaming reply feeds it the whole text at once, so streamed and non-streamed replies
agree by construction; the arguments' pieces concatenate to the ``arguments`` string.
"""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

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

