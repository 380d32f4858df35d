"""Incremental decoders of a call's arguments, one per encoding of
:class:`~grammarserve.fsm.tool_formats.Args`, used by the one tool-call parser
(:mod:`grammarserve.openai.toolparse_format`).

A decoder reads the text of the calls from a position (:meth:`step`) and returns how far it read
and the pieces of the call's OpenAI ``arguments`` (a JSON object as text) it can release, so
their concatenation is the arguments whatever the chunking. ``JSON`` arguments are released raw
as they are generated; XML (Qwen3-Coder) and pythonic arguments are released one property at a
time, as ``{"p": value``, ``, "q": value``, then ``}``: each value once it is complete, decoded
by the tool's schema (an XML ``string`` parameter is raw text; other values JSON, or Python
literals).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from grammarserve.fsm.json_lex import JsonValueEnd, string_end
from grammarserve.fsm.tool_args import resolve_ref, value_types
from grammarserve.fsm.tool_formats import Args

_XML_PARAM = re.compile(r"<parameter=([^>\n]*)>\n?")
_XML_END = "\n</parameter>"
_XML_DONE = "</function>"
_PY_NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*")

#: ``(next position, argument pieces, done)``; ``done`` is None while more text is needed,
#: True when the arguments ended (at the returned position), False when the text is no
#: arguments of this encoding.
Step = tuple[int, list[str], bool | None]


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _is_prefix(part: str, whole: str) -> bool:
    return whole.startswith(part)


class ArgsDecoder:
    """Base: counts the properties released (for the ``,`` between them)."""

    def __init__(self, params: dict[str, Any] | None) -> None:
        self.params = params or {}
        self.count = 0

    def step(self, text: str, pos: int) -> Step:
        raise NotImplementedError

    def _piece(self, name: str, value: Any) -> str:
        lead = "{" if self.count == 0 else ", "
        self.count += 1
        return f"{lead}{json.dumps(name, ensure_ascii=False)}: " \
               f"{json.dumps(value, ensure_ascii=False)}"

    def _close(self) -> str:
        return "}" if self.count else "{}"

    def _param_types(self, name: str) -> set[str] | None:
        sub = (self.params.get("properties") or {}).get(name)
        return value_types(resolve_ref(sub, self.params)) if sub is not None else None


class JsonArgs(ArgsDecoder):
    """A JSON value, released raw (an object or array as it streams; a string's content or
    another scalar when it is complete)."""

    def __init__(self, params: dict[str, Any] | None = None) -> None:
        super().__init__(params)
        self.scanner: JsonValueEnd | None = None
        self.start = -1

    def step(self, text: str, pos: int) -> Step:
        if self.start < 0:
            pos = _skip_ws(text, pos)
            if pos >= len(text):
                return pos, [], None
            self.start = pos
            if text[pos] in "{[":
                self.scanner = JsonValueEnd()
        if self.scanner is not None:
            n = self.scanner.feed(text[pos:])
            return pos + n, [text[pos:pos + n]] if n else [], True if self.scanner.done else None
        end = _scalar_end(text, self.start)
        if end is None:
            return pos, [], None
        raw = text[self.start:end]
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            return end, [], False
        return end, [value if isinstance(value, str) else raw], True


def _scalar_end(text: str, start: int) -> int | None:
    """The end of the JSON scalar at ``start`` (None: not complete yet)."""
    if text[start] == '"':
        return string_end(text, start)
    m = re.compile(r"[^\s,}\]]*").match(text, start)
    end = m.end() if m else start
    return end if end < len(text) else None


class XmlArgs(ArgsDecoder):
    """``<parameter=P>\\nVALUE\\n</parameter>`` per property, up to ``</function>`` (not
    consumed)."""

    def step(self, text: str, pos: int) -> Step:
        pieces: list[str] = []
        while True:
            pos = _skip_ws(text, pos)
            rest = text[pos:]
            if rest.startswith(_XML_DONE):
                return pos, pieces + [self._close()], True
            m = _XML_PARAM.match(text, pos)
            if m is not None and m.end() == len(text):  # NOTE: its newline may follow
                return pos, pieces, None
            if m is None:
                if not rest or _is_prefix(rest, _XML_DONE) or _is_prefix(rest, "<parameter=") \
                        or (rest.startswith("<parameter=") and "\n" not in rest):
                    return pos, pieces, None
                return pos, pieces, False
            end = text.find(_XML_END, m.end())
            if end < 0:
                return pos, pieces, None
            pieces.append(self._piece(m.group(1), self._value(m.group(1),
                                                              text[m.end():end])))
            pos = end + len(_XML_END)

    def _value(self, name: str, raw: str) -> Any:
        types = self._param_types(name)
        if types == {"string"}:
            return raw
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            pass
        try:
            return _jsonable(ast.literal_eval(raw.strip()))
        except (ValueError, SyntaxError, TypeError):
            return raw


class PythonArgs(ArgsDecoder):
    """``p=VALUE`` pairs joined by ``,`` up to ``)`` (not consumed); values Python literals."""

    def step(self, text: str, pos: int) -> Step:
        pieces: list[str] = []
        while True:
            pos = _skip_ws(text, pos)
            if pos >= len(text):
                return pos, pieces, None
            if text[pos] == ")":
                return pos, pieces + [self._close()], True
            if text[pos] == "," and self.count:
                pos += 1
                continue
            m = _PY_NAME.match(text, pos)
            if m is None or m.end() == len(text):
                ident = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\s*=?\s*").match(text, pos)
                return pos, pieces, None if ident and ident.end() == len(text) else False
            end = _python_value_end(text, m.end())
            if end is None:
                return pos, pieces, None
            pieces.append(self._piece(m.group(1), _python_value(text[m.end():end])))
            pos = end


def _python_value_end(text: str, start: int) -> int | None:
    """Where the Python literal at ``start`` ends (at a ``,`` or ``)`` outside brackets and
    strings); None if the text ends first."""
    depth, quote, escape = 0, "", False
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                return i
            depth -= 1
        elif ch == "," and depth == 0:
            return i
    return None


def _python_value(raw: str) -> Any:
    raw = raw.strip()
    try:
        return json.loads(raw)  # NOTE: what the grammar writes (JSON strings and numbers)
    except json.JSONDecodeError:
        pass
    try:
        return _jsonable(ast.literal_eval(raw))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return raw


def _jsonable(value: Any) -> Any:
    if isinstance(value, (tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def decoder(encoding: Args, params: dict[str, Any] | None) -> ArgsDecoder:
    """A new decoder of one call's arguments in ``encoding`` (``params``: the tool's schema)."""
    if encoding is Args.XML:
        return XmlArgs(params)
    if encoding is Args.PYTHONIC:
        return PythonArgs(params)
    return JsonArgs(params)
