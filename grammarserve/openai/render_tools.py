"""Past tool calls and results adapted to what a chat template accepts, and the tool-call
format described for templates that do not describe tools themselves.

A template that renders ``tool_calls`` gets OpenAI-shaped calls with their ``arguments`` as a
JSON object (templates write them with ``tojson`` or iterate their items), adapted like vLLM
does where a family's template refuses the OpenAI shape:

- ids: templates that require 9-character alphanumeric ids (Mistral's) get each call's id
  mapped to one (the same for the ``tool`` message that answers it);
- one call per message: templates that render only ``tool_calls[0]`` (Llama 3.x refuses more,
  gpt-oss drops them) get an assistant message per call, each followed by its own result.
"""

from __future__ import annotations

import hashlib
import json
import string
from typing import Any

from grammarserve.fsm.tool_formats import ToolFormat, calls_text

_ALNUM = string.ascii_letters + string.digits


def short_id(call_id: str) -> str:
    """A 9-character alphanumeric id for ``call_id`` (stable, so a call and its result agree)."""
    n = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    out = []
    for _ in range(9):
        n, r = divmod(n, len(_ALNUM))
        out.append(_ALNUM[r])
    return "".join(out)


def _wants_short_ids(template: str) -> bool:
    return "length != 9" in template or "length!=9" in template


def adapt_history(messages: list[dict[str, Any]], template: str) -> list[dict[str, Any]]:
    """``messages`` (plain dicts) as ``template`` accepts its past calls and results."""
    short = _wants_short_ids(template)
    single = "tool_calls[0]" in template
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = [_call(c, short) for c in m["tool_calls"]]
            if single and len(calls) > 1:
                out += [{**m, "content": m["content"] if i == 0 else "", "tool_calls": [c]}
                        for i, c in enumerate(calls)]
                continue
            out.append({**m, "tool_calls": calls})
        elif m["role"] == "tool":
            tid = m.get("tool_call_id") or ""
            out.append({**m, "tool_call_id": short_id(tid) if short and tid else tid})
        else:
            out.append(m)
    return _results_after_calls(out) if single else out


def _call(call: dict[str, Any], short: bool) -> dict[str, Any]:
    fn = dict(call["function"])
    try:
        fn["arguments"] = json.loads(fn.get("arguments") or "{}")
    except (json.JSONDecodeError, TypeError):
        pass
    cid = call.get("id") or ""
    return {**call, "id": short_id(cid) if short and cid else cid, "function": fn}


def _results_after_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each ``tool`` result moved right after the (one-call) assistant message it answers,
    when the results of split calls follow them together."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        run = []
        while i < len(messages) and messages[i]["role"] == "assistant" and \
                len(messages[i].get("tool_calls") or []) == 1:
            run.append(messages[i])
            i += 1
        results = []
        while run and i < len(messages) and messages[i]["role"] == "tool":
            results.append(messages[i])
            i += 1
        if len(run) > 1 and results:
            by_id = {r.get("tool_call_id"): r for r in results}
            for a in run:
                out.append(a)
                r = by_id.pop(a["tool_calls"][0].get("id"), None)
                if r is not None:
                    out.append(r)
            out += [r for r in results if r.get("tool_call_id") in by_id]
        else:
            out += run + results
        if not run and i < len(messages):
            out.append(messages[i])
            i += 1
    return out


def format_footer(fmt: ToolFormat) -> str:
    """How the built-in tools description asks for calls in ``fmt``."""
    example = calls_text(fmt, [("<function-name>", {"<parameter>": "<value>"})])
    return ("\n</tools>\n\nFor each function call, write it in exactly this format, with the "
            f"function's arguments:\n{example}")
