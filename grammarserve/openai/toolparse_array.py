"""The parser of each tool-call format: :func:`make_parser` and the non-streaming helpers.

Every format is read by the one table-driven parser
(:class:`~grammarserve.openai.toolparse_format.FormatParser`); :class:`ToolCallParser` (Hermes
``<tool_call>`` blocks) and :class:`JsonArrayParser` (``[{"name": "f", "parameters": {...}},
...]``) are that parser on their rows. An array whose ``]`` never came (the reply ended at a
repeated call, or at ``max_tokens``) still yields its complete calls; text that is no calls is
content.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grammarserve.fsm.tool_formats import HERMES, JSON_ARRAY, tool_format
from grammarserve.openai.toolparse import CallParser, ParsedCall
from grammarserve.openai.toolparse_format import FormatParser


class ToolCallParser(FormatParser):
    """The parser of Hermes calls (``<tool_call>`` blocks)."""

    def __init__(self) -> None:
        super().__init__(HERMES)


class JsonArrayParser(FormatParser):
    """The parser of the ``json_array`` format."""

    def __init__(self) -> None:
        super().__init__(JSON_ARRAY)


ToolParser = FormatParser


def make_parser(fmt: str, tools: Mapping[str, dict[str, Any]] | None = None) -> ToolParser:
    """The incremental parser of tool-call format ``fmt`` (a name of the formats table);
    ``tools``: each tool's ``parameters`` by name (XML values decode by their type)."""
    if fmt == "json_array":
        return JsonArrayParser()
    if fmt == "hermes":
        return ToolCallParser()
    return FormatParser(tool_format(fmt), tools)


def parse_calls(text: str, fmt: str = "hermes",
                tools: Mapping[str, dict[str, Any]] | None = None
                ) -> tuple[str | None, list[ParsedCall]]:
    """Non-streaming: ``(content or None, calls)`` of a complete output in format ``fmt``."""
    return parse_with(make_parser(fmt, tools), text)


def parse_tool_calls(text: str) -> tuple[str | None, list[ParsedCall]]:
    """Non-streaming: ``(content or None, calls)`` of a complete Hermes output."""
    return parse_calls(text, "hermes")


def parse_with(parser: CallParser, text: str
               ) -> tuple[str | None, list[ParsedCall]]:
    """Non-streaming: ``(content or None, calls)`` of a complete output, read by ``parser``
    (a new one)."""
    parser.feed(text)
    parser.finish()
    content = parser.content if (parser.content or not parser.calls) else None
    return content, parser.calls
