"""Batch input and output lines (OpenAI Batch API format).

Input: one JSON object per line, ``{"custom_id", "method": "POST", "url", "body"}``.
Output: ``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}``; lines
that could not run (bad JSON, missing or duplicate ``custom_id``, a 400) go to the error file,
carrying the input ``line`` number (1-based).

The input is indexed once (:func:`index_input`): valid lines keep their byte offset and a sort key
(the prompt-determining fields, so lines sharing a prompt prefix run together); bodies are read
back one at a time (:class:`InputReader`) so a 50,000-line file is never held in memory.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from typing_extensions import Self

from grammarserve.errors import InvalidRequestError
from grammarserve.openai.bodies import new_id
from grammarserve.openai.depth import DEFAULT_MAX_JSON_DEPTH, check_json_depth
from grammarserve.openai.endpoints import CHAT_URL, ENDPOINTS, RESPONSES_URL
from grammarserve.openai.errors import error_response

#: OpenAI's limits on one input file.
MAX_LINES = 50_000
MAX_BYTES = 200 * 2**20

SortKey = tuple[str, ...]


@dataclass(frozen=True)
class LineError:
    """An input line that cannot run; ``code`` is machine-readable (``invalid_json``,
    ``missing_custom_id``, ``duplicate_custom_id``, ``invalid_url``, ``invalid_request``...)."""

    line: int
    code: str
    message: str
    custom_id: str | None = None
    param: str | None = None


@dataclass(frozen=True)
class InputLine:
    """A valid input line (the first one with its ``custom_id``)."""

    line: int
    offset: int
    custom_id: str
    url: str
    key: SortKey = field(compare=False, repr=False)


@dataclass
class InputIndex:
    """Every request line of an input file: the valid ones (file order) and the bad ones."""

    lines: list[InputLine]
    errors: list[LineError]
    total: int  # request lines (blank lines are not counted)

    def sorted_lines(self) -> list[InputLine]:
        """Valid lines grouped by prompt (lines sharing a prompt prefix are adjacent)."""
        return sorted(self.lines, key=lambda x: (x.key, x.line))


def index_input(path: Path, *, endpoint: str | None = None) -> InputIndex:
    """Read ``path`` once: check each line's envelope and collect offsets and sort keys.

    ``endpoint`` (a batch's endpoint) makes lines that target another URL errors.
    """
    lines: list[InputLine] = []
    errors: list[LineError] = []
    seen: dict[str, int] = {}
    total = offset = 0
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            total += 1
            item = _check_envelope(number, raw, endpoint)
            if isinstance(item, LineError):
                errors.append(item)
                continue
            custom_id, url, key = item
            if custom_id in seen:
                errors.append(LineError(number, "duplicate_custom_id",
                                        f"custom_id {custom_id!r} is already used on line "
                                        f"{seen[custom_id]}; custom_ids must be unique",
                                        custom_id, "custom_id"))
                continue
            seen[custom_id] = number
            lines.append(InputLine(number, start, custom_id, url, key))
    return InputIndex(lines, errors, total)


def _check_envelope(number: int, raw: bytes, endpoint: str | None
                    ) -> LineError | tuple[str, str, SortKey]:
    try:
        # NOTE: the body sits one level down in its line: the server's default limit on it
        check_json_depth(raw, DEFAULT_MAX_JSON_DEPTH + 1, what=f"line {number}",
                         flag="the batch line limit")
    except InvalidRequestError as e:
        return LineError(number, "invalid_request", str(e))
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        return LineError(number, "invalid_json", f"line {number} is not valid JSON: {e}")
    if not isinstance(obj, dict):
        return LineError(number, "invalid_json", f"line {number} must be a JSON object")
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid:
        return LineError(number, "missing_custom_id",
                         f"line {number} has no 'custom_id' (a non-empty string)",
                         None, "custom_id")
    method = obj.get("method", "POST")
    if method != "POST":
        return LineError(number, "invalid_method", f"method must be 'POST', got {method!r}",
                         cid, "method")
    url = obj.get("url")
    if url not in ENDPOINTS or (endpoint is not None and url != endpoint):
        allowed = endpoint or " or ".join(ENDPOINTS)
        return LineError(number, "invalid_url", f"url must be {allowed}, got {url!r}", cid,
                         "url")
    body = obj.get("body")
    if not isinstance(body, dict):
        return LineError(number, "invalid_request", "'body' must be a JSON object", cid, "body")
    return cid, str(url), sort_key(str(url), body)


def sort_key(url: str, body: dict[str, Any]) -> SortKey:
    """The fields a prompt is rendered from, in prompt order (tools, then each message or input
    item).

    Strings are interned: 10,000 lines behind one system prompt hold it once.
    """
    parts = [url]
    if url == CHAT_URL:
        if body.get("tools"):
            parts.append(_text(body["tools"]))
        for m in body.get("messages") or []:
            if isinstance(m, dict):
                parts.append(_text(m.get("role")))
                parts.append(_text(m.get("content")))
    elif url == RESPONSES_URL:
        if body.get("tools"):
            parts.append(_text(body["tools"]))
        parts.append(_text(body.get("instructions")))
        items = body.get("input")
        for item in items if isinstance(items, list) else [items]:
            parts.append(_text(item))
    else:
        parts.append(_text(body.get("prompt")))
    return tuple(sys.intern(p) for p in parts)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


class InputReader:
    """Reads line bodies back by offset (keeps one open handle, so a file deleted meanwhile can
    still be read to the end)."""

    def __init__(self, path: Path) -> None:
        self._f: IO[bytes] = open(path, "rb")  # noqa: SIM115 - closed by close()

    def body(self, line: InputLine) -> dict[str, Any]:
        self._f.seek(line.offset)
        body = json.loads(self._f.readline())["body"]
        assert isinstance(body, dict)  # checked by index_input
        return body

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- output lines -------------------------------------------------------------------------------
def response_line(custom_id: str, status: int, body: dict[str, Any], *,
                  line: int | None = None) -> dict[str, Any]:
    """A line of the output file (200) or of the error file (4xx/5xx, with the input line)."""
    out: dict[str, Any] = {"id": new_id("batch_req", sep="_"), "custom_id": custom_id,
                           "response": {"status_code": status,
                                        "request_id": new_id("req", sep="_"), "body": body},
                           "error": None}
    if line is not None:
        out["line"] = line
    return out


def failure_line(custom_id: str, e: BaseException, line: int) -> dict[str, Any]:
    """A line of the error file for a request that failed with ``e`` (the status and body the
    HTTP server answers it with)."""
    status, body = error_response(e)
    return response_line(custom_id, status, body, line=line)


def error_line(err: LineError) -> dict[str, Any]:
    """A line of the error file for an input line that could not be read as a request."""
    return {"id": new_id("batch_req", sep="_"), "custom_id": err.custom_id, "response": None,
            "error": {"code": err.code, "message": err.message, "param": err.param,
                      "line": err.line},
            "line": err.line}


def error_entry(err: LineError) -> dict[str, Any]:
    """The batch object's ``errors.data`` entry for a bad line."""
    return {"code": err.code, "line": err.line, "message": err.message, "param": err.param}
