"""Tool-call grammars, in every format of the table :mod:`grammarserve.fsm.tool_formats`.

``normalize_tools`` validates OpenAI ``tools`` + ``tool_choice`` + the format's name into a JSON
description; ``tool_calls_lark`` renders it as an llguidance Lark grammar driven by the format's
row: its literal envelope (list open/close, call open, the name, separators, call close), each
call's arguments from :mod:`grammarserve.fsm.tool_args` (``%json`` of the tool's parameters, or
per-property rules for XML and pythonic arguments), and for formats whose call is a JSON object
holding the name (Hermes, Llama 3 JSON, the JSON arrays) one ``%json`` call object per tool
``{"name": <const>, "arguments" | "parameters": <that tool's parameters>}``; formats whose calls
form one JSON array (``json_array``, pre-v11 Mistral) have the whole array as one ``%json``.

Modes (every grammar covers the *whole* output)
------------------------------------------------
- ``"required"``: one or more calls (one if ``parallel`` is False or the format is single).
- named (``{"type": "function", "function": {"name": "f"}}``): exactly one call to ``f``.
- ``"auto"``: either plain text, or calls. For a trigger that may come anywhere (Hermes'
  ``<tool_call>``): plain text that never contains it (possibly empty), or free text (possibly
  empty) up to its first occurrence, then the calls. For calls that must start the reply
  (llama3_json, pythonic): plain text that does not start with a trigger, or the calls.
  Formats without triggers (``json_array``) have no ``auto`` mode.

Between two calls whitespace is allowed before the separator, and after the last call only
whitespace (bounded like JSON whitespace), then the stop token. The grammar works on bytes, so a
token may straddle any boundary: ``.<`` (text, then the trigger's first byte), ``>\\n{"``
(trigger, newline, JSON), or ``}}\\n</`` (JSON, then the end tag). The free text before a
trigger is one *lazy* lexeme ``/(?s:.*)<tool_call>/``: it ends at the first occurrence of the
trigger, which then must be followed by a call. No trigger detection is needed outside the
grammar.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from grammarserve.errors import GrammarError
from grammarserve.fsm.limits import GrammarLimits
from grammarserve.fsm.schema.tree import rebase_refs
from grammarserve.fsm.tool_args import RAW_RULE, args_rules, check_args, lit
from grammarserve.fsm.tool_formats import FORMATS as _TABLE
from grammarserve.fsm.tool_formats import HERMES, ToolFormat, tool_format

TRIGGER = HERMES.triggers[0]
END = HERMES.call_close.strip()
FORMATS = tuple(_TABLE)
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

SchemaCheck = Callable[[Any, bool, str], dict[str, Any]]


def normalize_tools(tools: list[dict[str, Any]], mode: Any, *, parallel: bool,
                    check_schema: SchemaCheck, fmt: str = "hermes",
                    limits: GrammarLimits | None = None) -> dict[str, Any]:
    """Validate OpenAI ``tools``, ``tool_choice`` and the call format ``fmt``; at most
    ``limits.max_tools`` tools (default ``GrammarLimits()``), counted before any is read.

    ``check_schema(schema, strict, path)`` validates each tool's ``parameters`` (the JSON Schema
    front end). Returns ``{"tools": [{"name", "parameters"}], "mode", "parallel", "format"}``.
    """
    try:
        form = tool_format(fmt)
    except (KeyError, TypeError):
        raise GrammarError(f"tool call format must be one of {', '.join(FORMATS)}, got {fmt!r}",
                           path="$.format") from None
    if mode == "auto" and not form.has_auto:
        raise GrammarError(f"the {form.name} tool-call format has no 'auto' mode (text and "
                           "calls could not be told apart); use the hermes format",
                           path="$.tool_choice")
    if not isinstance(tools, list) or not tools:
        raise GrammarError("'tools' must be a non-empty list of function tools", path="$.tools")
    most = (limits or GrammarLimits()).max_tools
    if len(tools) > most:
        raise GrammarError(f"'tools' has {len(tools):,} tools, more than this server's limit "
                           f"of {most:,} tools in one request (max_tools)", path="$.tools")
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
        check_args(form.args, name, schema, f"{where}.function.parameters")
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
    parallel = bool(parallel) and not form.single
    return {"tools": out, "mode": kind, "parallel": parallel, "format": form.name}


def _check_object_schema(params: Any, name: str, where: str) -> None:
    """A tool's arguments are a JSON object, so its ``parameters`` must be an object schema,
    as OpenAI requires (its wording; a missing ``type`` is refused too, as ``'type:
    "None"'``). Omitted or ``{}`` parameters mean no arguments."""
    kind = params.get("type") if isinstance(params, dict) else type(params).__name__
    if kind != "object":
        shown = kind if isinstance(kind, str) else json.dumps(kind) if kind is not None else None
        raise GrammarError(f"Invalid schema for function '{name}': schema must be a JSON Schema "
                           f"of 'type: \"object\"', got 'type: \"{shown}\"'.", path=where)


def call_schema(tool: dict[str, Any], json_options: dict[str, Any], name_key: str = "name",
                args_key: str = "arguments") -> dict[str, Any]:
    """JSON Schema of one call object ``{"name": <const>, "arguments": <parameters>}``."""
    return {
        "type": "object",
        "properties": {name_key: {"const": tool["name"]}, args_key: {"$ref": "#/$defs/args"}},
        "required": [name_key, args_key],
        "additionalProperties": False,
        "$defs": {"args": rebase_refs(tool["parameters"], "#/$defs/args")},
        "x-guidance": json_options,
    }


def calls_array_schema(spec: dict[str, Any], json_options: dict[str, Any],
                       args_key: str = "parameters") -> dict[str, Any]:
    """JSON Schema of the calls as one JSON array: ``[{"name": <const>, "parameters": ...},
    ...]``, one item unless ``parallel``. Separators come from ``json_options`` like any JSON
    value."""
    defs: dict[str, Any] = {}
    for i, tool in enumerate(spec["tools"]):
        defs[f"call{i}"] = {
            "type": "object",
            "properties": {"name": {"const": tool["name"]},
                           args_key: {"$ref": f"#/$defs/args{i}"}},
            "required": ["name", args_key], "additionalProperties": False}
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


def lex(text: str) -> str:
    """``text`` as the body of a Lark regex: ASCII punctuation and space as ``\\xHH``."""
    return "".join(c if c.isalnum() or ord(c) > 127 else f"\\x{ord(c):02X}" for c in text)


def _calls(fmt: ToolFormat, spec: dict[str, Any], json_options: dict[str, Any],
           max_ws: int | None) -> tuple[list[str], str]:
    """``(rules, calls)``: the rules of the calls and the expansion of the calls after the
    format's opening (``list_open + call_open`` of the first call)."""
    if fmt.json_array:
        schema = calls_array_schema(spec, json_options, fmt.args_key)
        return [f"calls: %json {json.dumps(schema, ensure_ascii=False)}"], "calls"
    rules: list[str] = []
    for i, tool in enumerate(spec["tools"]):
        if fmt.name_key is not None:
            obj = call_schema(tool, json_options, fmt.name_key, fmt.args_key)
            rules.append(f"fn{i}: %json {json.dumps(obj, ensure_ascii=False)}")
            continue
        args, empty = args_rules(fmt.args, tool["name"], tool["parameters"], f"args{i}",
                                 json_options)
        rules += args
        parts = [lit(tool["name"] + fmt.name_close)]
        if args:
            parts.append(f"args{i}?" if empty else f"args{i}")
        if fmt.call_close:
            parts.append(lit(fmt.call_close))
        rules.append(f"fn{i}: " + " ".join(parts))
    if any("xml_raw" in r for r in rules):
        rules.append(RAW_RULE)
    fn = "fn"
    rules.append("fn: " + " | ".join(f"fn{i}" for i in range(len(spec["tools"]))))
    if fmt.name_key is not None and fmt.call_close:
        fn = f"fn {lit(fmt.call_close)}"
    body = fn
    if spec["parallel"]:
        between = (fmt.sep + fmt.call_open).lstrip()
        rules.append(f"SEP: /{_ws(max_ws)}{lex(between)}/")
        body += f" (SEP {fn})*"
    if fmt.list_close:
        body += f" {lit(fmt.list_close)}"
    return rules, body


def tool_calls_lark(spec: dict[str, Any], json_options: dict[str, Any],
                    max_ws: int | None = None) -> str:
    """The llguidance Lark grammar for a normalized tool-call spec (whole output).

    ``max_ws`` bounds the whitespace between calls and after the last one (``None``: unbounded);
    a reply of one call (not ``parallel``, or a format that writes one) ends right after it.
    """
    fmt = tool_format(spec.get("format", "hermes"))
    rules, calls = _calls(fmt, spec, json_options, max_ws)
    # NOTE: a JSON array's ``[`` is part of its ``%json``, not of the literal opening.
    opening = fmt.opening[:-1] if fmt.json_array else fmt.opening
    one_call = not spec["parallel"] or fmt.single  # NOTE: nothing can follow: the reply ends
    tail = "" if one_call else " TAIL"
    if spec["mode"] == "auto" and fmt.trigger_anywhere:
        trigger = fmt.triggers[0]
        rest = opening[len(trigger):]
        # NOTE: TEXT is plain text without the trigger; ``head`` is lazy, so it ends at the
        # first trigger, after which only calls may follow.
        start = [f"start: TEXT | head {lit(rest) + ' ' if rest else ''}{calls}{tail}",
                 rf"TEXT: /(?s:.*)/ & ~/(?s:.*){lex(trigger)}(?s:.*)/",
                 rf"head[lazy]: /(?s:.*){lex(trigger)}/"]
    else:
        head = ""
        if fmt.open_optional and fmt.list_open:
            head = f"{lit(fmt.list_open)}? " + (f"{lit(fmt.call_open)} " if fmt.call_open
                                                else "")
        elif opening:
            head = f"{lit(opening)} "
        start = [f"start: {head}{calls}{tail}"]
        if spec["mode"] == "auto":
            starts = "|".join(lex(t) for t in fmt.triggers)
            start = [f"start: TEXT | {head}{calls}{tail}",
                     rf"TEXT: /(?s:.*)/ & ~/({starts})(?s:.*)/"]
    tail_rule = [] if one_call else [f"TAIL: /{_ws(max_ws)}/"]
    return "\n".join([*start, *rules, *tail_rule]) + "\n"
