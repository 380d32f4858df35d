"""Is a served reply valid under the constraint its request sent? For the validated soak.

A 200 reply (plain JSON or a server-sent event stream, joined) is read choice by choice; a choice
with ``finish_reason: "stop"`` must be valid: ``response_format`` JSON parsed and validated with
``jsonschema`` (Draft 2020-12, format checker on; ``multipleOf`` read in decimal, ``pattern``
by the ``regex`` module where ``re`` cannot read it) against the schema as sent, a ``regex`` full
match, a ``choice`` one of them; tool calls (``finish_reason`` "stop" or "tool_calls") name a
tool sent and carry arguments valid under its ``parameters``. A reply cut by ``max_tokens``
(``"length"``) is not judged.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from decimal import Context, Decimal, InvalidOperation, localcontext
from typing import Any

import jsonschema
import regex
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError


def _pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Any:
    """``pattern`` with ``re``'s search semantics, the ``regex`` module where ``re`` cannot read
    the pattern (``\\p{L}``)."""
    if not validator.is_type(instance, "string"):
        return
    try:
        found = re.search(patrn, instance) is not None
    except re.error:
        found = regex.search(patrn, instance) is not None
    if not found:
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


#: Digits enough for any quotient of two doubles (1.8e308 / 5e-324 has 632).
_DIGITS = 700


def _multiple_of(validator: Any, divisor: Any, instance: Any, schema: Any) -> Any:
    """``multipleOf`` on the numbers as written in decimal (``jsonschema`` divides floats:
    ``1.0`` is not a multiple of ``1e-9`` there, nor ``0.3`` of ``0.1``)."""
    if not validator.is_type(instance, "number"):
        return
    with localcontext(Context(prec=_DIGITS, traps=[InvalidOperation])):
        failed = Decimal(repr(instance)) % Decimal(repr(divisor)) != 0
    if failed:
        yield ValidationError(f"{instance!r} is not a multiple of {divisor}")


#: Draft 2020-12 with the ``pattern`` above; ``multipleOf`` as ``jsonschema`` has it (floats).
StockValidator = jsonschema.validators.extend(Draft202012Validator, {"pattern": _pattern})
Validator = jsonschema.validators.extend(StockValidator, {"multipleOf": _multiple_of})


@dataclass(frozen=True)
class Verdict:
    """``finished``: a 200 whose every choice has a ``finish_reason``; ``stops``: choices that
    stopped (or called tools) and were judged; ``invalid``: the first problem found, if any;
    ``unverifiable``: a schema or pattern this checker itself cannot read; ``stream_error``:
    the error event a 200 stream ended with (its ``type`` and message); ``float_disagreement``:
    a reply valid in decimal that stock ``jsonschema`` calls invalid (its float division)."""

    finished: bool
    stops: int = 0
    invalid: str | None = None
    unverifiable: str | None = None
    stream_error: str | None = None
    float_disagreement: str | None = None


class FloatDisagreement(Exception):
    """Valid as written in decimal; stock ``jsonschema``'s float ``multipleOf`` says not."""


class StreamError(ValueError):
    """A stream that ended with an error event instead of a finish reason."""


def read_reply(text: str) -> list[dict[str, Any]]:
    """The choices of a reply: ``{"finish_reason", "content", "tool_calls"}``, a stream's
    deltas joined per index."""
    if not text.lstrip().startswith("data:"):
        doc = json.loads(text)
        out = []
        for c in doc.get("choices", []):
            msg = c.get("message") or {}
            out.append({"finish_reason": c.get("finish_reason"),
                        "content": msg.get("content", c.get("text")),
                        "tool_calls": msg.get("tool_calls") or []})
        return out
    joined: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        if not line.startswith("data:") or line.strip() == "data: [DONE]":
            continue
        event = json.loads(line[5:])
        if "error" in event:
            err = event["error"]
            raise StreamError(f"{err.get('type')}: {err.get('message')}"
                              if isinstance(err, dict) else str(err))
        for c in event.get("choices", []):
            slot = joined.setdefault(c.get("index", 0), {"finish_reason": None, "content": "",
                                                         "tool_calls": {}})
            delta = c.get("delta") or {}
            slot["content"] += delta.get("content") or c.get("text") or ""
            for tc in delta.get("tool_calls") or []:
                call = slot["tool_calls"].setdefault(tc.get("index", 0), {
                    "function": {"name": "", "arguments": ""}})
                fn = tc.get("function") or {}
                call["function"]["name"] += fn.get("name") or ""
                call["function"]["arguments"] += fn.get("arguments") or ""
            if c.get("finish_reason"):
                slot["finish_reason"] = c["finish_reason"]
    return [{**s, "tool_calls": [s["tool_calls"][k] for k in sorted(s["tool_calls"])]}
            for _, s in sorted(joined.items())]


def _schema_problem(schema: Any, text: str) -> str | None:
    try:
        value = json.loads(text)
    except ValueError as e:
        return f"not JSON ({e})"
    formats = Draft202012Validator.FORMAT_CHECKER
    error = jsonschema.exceptions.best_match(
        Validator(schema, format_checker=formats).iter_errors(value))
    if error is not None:
        return f"{error.message} at {error.json_path}"
    stock = jsonschema.exceptions.best_match(
        StockValidator(schema, format_checker=formats).iter_errors(value))
    if stock is not None:
        raise FloatDisagreement(f"stock jsonschema: {stock.message} at {stock.json_path}")
    return None


def _choice_problem(req: dict[str, Any], choice: dict[str, Any]) -> str | None:
    content = choice["content"] or ""
    rf = req.get("response_format") or {}
    if rf.get("type") == "json_schema":
        return _schema_problem(rf["json_schema"].get("schema", {}), content)
    if rf.get("type") == "json_object":
        return _schema_problem({"type": "object"}, content)
    if "regex" in req:
        try:
            ok = re.fullmatch(req["regex"], content) is not None
        except re.error:
            ok = regex.fullmatch(req["regex"], content) is not None
        return None if ok else f"{content!r} is not a full match of {req['regex']!r}"
    if "choice" in req:
        return None if content in req["choice"] else f"{content!r} is not one of the choices"
    return None


def _tool_problem(req: dict[str, Any], choice: dict[str, Any]) -> str | None:
    tools = {t["function"]["name"]: t["function"].get("parameters", {})
             for t in req.get("tools", []) if isinstance(t, dict) and "function" in t}
    if not choice["tool_calls"] and req.get("tool_choice") == "required":
        return "tool_choice 'required' and no tool call"
    for call in choice["tool_calls"]:
        name = call["function"]["name"]
        if name not in tools:
            return f"tool call names {name!r}, not a tool sent"
        problem = _schema_problem(tools[name], call["function"]["arguments"])
        if problem:
            return f"tool {name!r} arguments: {problem}"
    return None


def check(req: Any, status: int, text: str) -> Verdict:
    """The verdict on one reply to ``req`` (the JSON body sent; anything else is not judged)."""
    if status != 200:
        return Verdict(finished=False)
    try:
        choices = read_reply(text)
    except StreamError as e:
        return Verdict(finished=False, stream_error=str(e)[:600])
    except (ValueError, KeyError, TypeError) as e:
        return Verdict(finished=False, invalid=f"unreadable 200 reply: {e}")
    finished = bool(choices) and all(c["finish_reason"] for c in choices)
    if not isinstance(req, dict) or not isinstance(req.get("messages", req.get("prompt")),
                                                   (list, str)):
        return Verdict(finished=finished)
    stops = 0
    for c in choices:
        if c["finish_reason"] not in ("stop", "tool_calls"):
            continue
        stops += 1
        try:
            problem = (_tool_problem(req, c) if c["tool_calls"] or req.get("tools")
                       else _choice_problem(req, c))
        except FloatDisagreement as e:
            return Verdict(finished, stops, float_disagreement=str(e)[:600])
        except (jsonschema.exceptions.SchemaError, re.error, regex.error, RecursionError,
                ValueError, TypeError, ArithmeticError) as e:
            return Verdict(finished, stops, unverifiable=f"{type(e).__name__}: {e}"[:300])
        if problem:
            return Verdict(finished, stops, invalid=f"{c['finish_reason']}: {problem}"[:600])
    return Verdict(finished, stops)
