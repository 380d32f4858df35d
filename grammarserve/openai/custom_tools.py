"""Custom tools (OpenAI's ``{"type": "custom"}``): a call carries free text, its ``input``, which a
Lark grammar or a regex may constrain (coding agents use them for patch tools).

grammarserve serves a custom tool call as the whole reply: when ``tool_choice`` names the tool
(or is ``required`` and it is the only tool), the reply is its input, constrained by its grammar
(:mod:`grammarserve.openai.translate` builds the plan), and comes back as one custom tool call.
This module checks a custom tool's definition (:func:`custom_specs`, each mistake a 400 naming
the tool) and parses a reply into that call, with the same events as the function-call parsers
(:class:`CustomInputParser`), so the streamed input adds up to the non-streamed one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from grammarserve.errors import InvalidRequestError
from grammarserve.openai.protocol import AnyTool, CustomTool
from grammarserve.openai.toolparse import (
    Event,
    ParsedCall,
    ToolCallArgs,
    ToolCallStart,
    ToolKind,
    new_call_id,
)

_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


class CustomSyntax(str, Enum):
    """How a custom tool's input is constrained: not at all (``text``), by a Lark grammar or by
    a regex."""

    TEXT = "text"
    LARK = "lark"
    REGEX = "regex"


@dataclass(frozen=True)
class CustomToolSpec:
    """A checked custom tool of a request."""

    index: int  # its position in the request's ``tools``
    name: str
    description: str | None
    syntax: CustomSyntax
    definition: str = ""  # the grammar or regex ("" for text)

    @property
    def param(self) -> str:
        """The request param of its grammar (errors of the grammar name it)."""
        return f"tools[{self.index}].custom.format.grammar.definition"


def custom_spec(tool: CustomTool, index: int) -> CustomToolSpec:
    """The checked form of ``tools[index]``; a mistake is a 400 naming the tool and the field."""
    where = f"tools[{index}].custom"
    name = tool.custom.name
    if not _NAME.fullmatch(name):
        raise InvalidRequestError(f"the name of custom tool {name!r} must match "
                                  "^[a-zA-Z0-9_-]{1,64}$", param=f"{where}.name")
    fmt = tool.custom.format
    if fmt is None or fmt.type == "text":
        return CustomToolSpec(index, name, tool.custom.description, CustomSyntax.TEXT)
    if fmt.type != "grammar":
        raise InvalidRequestError(f"the format of custom tool {name!r} must be of type 'text' or "
                                  f"'grammar', got {fmt.type!r}", param=f"{where}.format.type")
    grammar = fmt.grammar
    if grammar is None:
        raise InvalidRequestError(f"the format of custom tool {name!r} is of type 'grammar' but "
                                  "has no 'grammar'", param=f"{where}.format.grammar")
    if grammar.syntax not in (CustomSyntax.LARK.value, CustomSyntax.REGEX.value):
        got = "none" if grammar.syntax is None else repr(grammar.syntax)
        raise InvalidRequestError(f"the grammar syntax of custom tool {name!r} must be 'lark' or "
                                  f"'regex', got {got}", param=f"{where}.format.grammar.syntax")
    if grammar.definition is None or not grammar.definition.strip():
        raise InvalidRequestError(f"the grammar of custom tool {name!r} is "
                                  f"{'missing' if grammar.definition is None else 'empty'} "
                                  "(its 'definition')", param=f"{where}.format.grammar.definition")
    return CustomToolSpec(index, name, tool.custom.description, CustomSyntax(grammar.syntax),
                          grammar.definition)


def custom_specs(tools: Sequence[AnyTool], function_names: Sequence[str]
                 ) -> tuple[CustomToolSpec, ...]:
    """The custom tools of ``tools``, checked; a name used twice (or also a function's) is a
    400, since a call names its tool."""
    seen = set(function_names)
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, CustomTool):
            continue
        spec = custom_spec(tool, i)
        if spec.name in seen:
            raise InvalidRequestError(f"tools[{i}]: the name {spec.name!r} of this custom tool is "
                                      "already the name of another tool",
                                      param=f"tools[{i}].custom.name")
        seen.add(spec.name)
        out.append(spec)
    return tuple(out)


@dataclass
class CustomInputParser:
    """The reply as the input of one call of the custom tool ``name``: the call starts at the
    first output and every piece of text is a piece of its input. Fed like the function-call
    parsers (:meth:`feed`, then :meth:`finish` once)."""

    name: str
    calls: list[ParsedCall] = field(default_factory=list)
    content: str = ""  # never any: the whole reply is the input

    def feed(self, text: str) -> list[Event]:
        events: list[Event] = []
        if not self.calls:
            self.calls.append(ParsedCall(new_call_id(), self.name, kind=ToolKind.CUSTOM))
            events.append(ToolCallStart(0, self.calls[0].id, self.name, kind=ToolKind.CUSTOM))
        if text:
            self.calls[0].arguments += text
            events.append(ToolCallArgs(0, text, kind=ToolKind.CUSTOM))
        return events

    def finish(self) -> list[Event]:
        return self.feed("") if not self.calls else []
