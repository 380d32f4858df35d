"""Tool-call grammars in two formats (``FORMATS``):

- ``"hermes"``: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks;
- ``"json_array"``: one JSON array of calls, ``[{"name": ..., "parameters": {...}}, ...]``, like
  vLLM's ``required`` mode for chat templates without tool support (no ``auto`` mode: plain text
  and an array could not be told apart).

``normalize_tools`` validates OpenAI ``tools`` + ``tool_choice`` into a JSON description;
``tool_calls_lark`` renders it as an llguidance Lark grammar with embedded ``%json`` schemas
(each call object ``{"name": <const>, "arguments" | "parameters": <that tool's parameters>}``).

Modes (every grammar covers the *whole* output)
------------------------------------------------
- ``"required"``: one or more calls (one if ``parallel`` is False).
- named (``{"type": "function", "function": {"name": "f"}}``): exactly one call to ``f``.
- ``"auto"``: either plain text that never contains ``<tool_call>`` (possibly empty), or free
  text (possibly empty) up to the first ``<tool_call>``, then the calls.

Between two calls and after the last one only whitespace is allowed (bounded like JSON
whitespace), then the stop token. The grammar works on bytes, so a token may straddle any
boundary: ``.<`` (text, then the trigger's first byte), ``>\\n{"`` (trigger, newline, JSON), or
``}}\\n</`` (JSON, then the end tag). The free text before the trigger is one *lazy* lexeme
``/(?s:.*)<tool_call>/``: it ends at the first occurrence of the trigger, which then must be
followed by a call. No trigger detection is needed outside the grammar.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from grammarserve.errors import GrammarError
from grammarserve.fsm.json_schema import rebase_refs

TRIGGER = "<tool_call>"
END = "</tool_call>"
FORMATS = ("hermes", "json_array")
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

SchemaCheck = Callable[[Any, bool, str], dict[str, Any]]


def normalize_tools(tools: list[dict[str, Any]], mode: Any, *, parallel: bool,
                    check_schema: SchemaCheck, fmt: str = "hermes") -> dict[str, Any]:
    """Validate OpenAI ``tools``, ``tool_choice`` and the call format ``fmt``.

    ``check_schema(schema, strict, path)`` validates each tool's ``parameters`` (the JSON Schema
    front end). Returns ``{"tools": [{"name", "parameters"}], "mode", "parallel", "format"}``.
    """
    if fmt not in FORMATS:
        raise GrammarError(f"tool call format must be one of {', '.join(FORMATS)}, got {fmt!r}",
                           path="$.format")
    if fmt == "json_array" and mode == "auto":
        raise GrammarError("the json_array tool-call format has no 'auto' mode (text and calls "
                           "could not be told apart); use the hermes format",
                           path="$.tool_choice")
    if not isinstance(tools, list) or not tools:
        raise GrammarError("'tools' must be a non-empty list of function tools", path="$.tools")
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        where = f"$.tools[{i}]"
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or (isinstance(tool, dict) and
                                        tool.get("type", "function") != "function"):
            raise GrammarError(f"{where} must be {{'type': 'function', 'function': {{...}}}}",
                               path=where)
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise GrammarError(f"{where}.function.name must match ^[a-zA-Z0-9_-]{{1,64}}$, got "
                               f"{name!r}", path=f"{where}.function.name")
        if any(t["name"] == name for t in out):
            raise GrammarError(f"duplicate tool name {name!r} at {where}", path=where)
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        _check_object_schema(params, name, f"{where}.function.parameters")
        schema = check_schema(params, bool(fn.get("strict")), f"{where}.function.parameters")
        out.append({"name": name, "parameters": schema})
    if mode in ("auto", "required"):
        kind = mode
    elif isinstance(mode, dict):
        name = (mode.get("function") or {}).get("name")
        match = [t for t in out if t["name"] == name]
        if not match:
            raise GrammarError(f"tool_choice names {name!r}, which is not in 'tools' "
                               f"({[t['name'] for t in out]})", path="$.tool_choice")
        out, kind, parallel = match, "named", False
    else:
        raise GrammarError(f"tool_choice must be 'auto', 'required' or {{'type': 'function', "
                           f"'function': {{'name': ...}}}}, got {mode!r}", path="$.tool_choice")
    return {"tools": out, "mode": kind, "parallel": bool(parallel), "format": fmt}


def _check_object_schema(params: Any, name: str, where: str) -> None:
    """A tool's arguments are a JSON object, so its ``parameters`` must be an object schema,
    as OpenAI requires (its wording; a missing ``type`` is refused too, as ``'type:
    "None"'``). Omitted or ``{}`` parameters mean no arguments."""
    kind = params.get("type") if isinstance(params, dict) else type(params).__name__
    if kind != "object":
        shown = kind if isinstance(kind, str) else json.dumps(kind) if kind is not None else None
        raise GrammarError(f"Invalid schema for function '{name}': schema must be a JSON Schema "
                           f"of 'type: \"object\"', got 'type: \"{shown}\"'.", path=where)


def call_schema(tool: dict[str, Any], json_options: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema of one call object ``{"name": <const>, "arguments": <parameters>}``."""
    return {
        "type": "object",
        "properties": {"name": {"const": tool["name"]}, "arguments": {"$ref": "#/$defs/args"}},
        "required": ["name", "arguments"],
        "additionalProperties": False,
        "$defs": {"args": rebase_refs(tool["parameters"], "#/$defs/args")},
        "x-guidance": json_options,
    }


def calls_array_schema(spec: dict[str, Any], json_options: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema of the ``json_array`` format: ``[{"name": <const>, "parameters": ...}, ...]``,
    one item unless ``parallel``. Separators come from ``json_options`` like any JSON value."""
    defs: dict[str, Any] = {}
    for i, tool in enumerate(spec["tools"]):
        defs[f"call{i}"] = {
            "type": "object",
            "properties": {"name": {"const": tool["name"]},
                           "parameters": {"$ref": f"#/$defs/args{i}"}},
            "required": ["name", "parameters"], "additionalProperties": False}
        defs[f"args{i}"] = rebase_refs(tool["parameters"], f"#/$defs/args{i}")
    schema: dict[str, Any] = {
        "type": "array", "minItems": 1,
        "items": {"anyOf": [{"$ref": f"#/$defs/call{i}"} for i in range(len(spec["tools"]))]},
        "$defs": defs, "x-guidance": json_options}
    if not spec["parallel"]:
        schema["maxItems"] = 1
    return schema


def _ws(max_ws: int | None) -> str:
    if max_ws == 0:  # compact JSON: calls are separated by at most one newline
        return r"\x0A?"
    return r"[\x20\x0A\x0D\x09]" + ("*" if max_ws is None else f"{{0,{max_ws}}}")


def tool_calls_lark(spec: dict[str, Any], json_options: dict[str, Any],
                    max_ws: int | None = None) -> str:
    """The llguidance Lark grammar for a normalized tool-call spec (whole output).

    ``max_ws`` bounds the whitespace between calls and after the last one (``None``: unbounded).
    """
    if spec.get("format", "hermes") == "json_array":
        return "\n".join([
            "start: calls TAIL",
            f"calls: %json {json.dumps(calls_array_schema(spec, json_options))}",
            f"TAIL: /{_ws(max_ws)}/"]) + "\n"
    fns = [f"fn{i}: %json {json.dumps(call_schema(tool, json_options))}"
           for i, tool in enumerate(spec["tools"])]
    more = " (SEP call)*" if spec["parallel"] else ""
    if spec["mode"] == "auto":
        # NOTE: TEXT is plain text without the trigger; ``head`` is lazy, so it ends at the
        # first ``<tool_call>``, after which only a call may follow.
        start = [f"start: TEXT | head call{more} TAIL",
                 r"TEXT: /(?s:.*)/ & ~/(?s:.*)<tool_call>(?s:.*)/",
                 r"head[lazy]: /(?s:.*)<tool_call>/"]
    else:
        start = [f'start: "{TRIGGER}" call{more} TAIL']
    return "\n".join([
        *start,
        f'call: "\\n" fn "\\n{END}"',
        f"SEP: /{_ws(max_ws)}{TRIGGER}/",
        f"TAIL: /{_ws(max_ws)}/",
        f'fn: {" | ".join(f"fn{i}" for i in range(len(fns)))}',
        *fns]) + "\n"
