"""Batch API over plain HTTP for the end-to-end tests (test_server_supervision.py,
test_server_keys_limits_e2e.py): small chat lines, uploads, starting and awaiting a batch."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from serverproc import request
from waiting import wait_until

CHAT = "/v1/chat/completions"


def chat(i: int, max_tokens: int = 12) -> dict[str, Any]:
    """A small chat request constrained to ``{"n": integer}``."""
    return {"model": "m", "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": f"Item {i}: give a number in JSON."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {
                "type": "object", "properties": {"n": {"type": "integer"}},
                "required": ["n"]}}}}


def upload(url: str, data: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """POST /v1/files (multipart, purpose batch)."""
    body = (b'--XB\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            b'--XB\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
            b"Content-Type: application/octet-stream\r\n\r\n" + data + b"\r\n--XB--\r\n")
    return request("POST", url + "/v1/files", raw=body, headers={
        "Content-Type": "multipart/form-data; boundary=XB", **(headers or {})})


def start_batch(url: str, n: int, headers: dict[str, str] | None = None) -> str:
    """A batch of ``n`` small schema-constrained chat lines (``req-0``...); its id."""
    lines = "".join(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": CHAT,
                                "body": chat(i)}) + "\n" for i in range(n))
    status, f = upload(url, lines.encode(), headers)
    assert status == 200, f
    status, b = request("POST", url + "/v1/batches", {
        "input_file_id": f["id"], "endpoint": CHAT, "completion_window": "24h"},
        headers=headers)
    assert status == 200, b
    return str(b["id"])


def wait_batch(url: str, bid: str, done: Any, timeout: float = 900,
               headers: dict[str, str] | None = None) -> dict[str, Any]:
    """Poll the batch until ``done(batch)`` (fails the test after ``timeout`` seconds)."""
    seen: list[Any] = [None]

    def reached() -> bool:
        status, b = request("GET", f"{url}/v1/batches/{bid}", headers=headers)
        seen[0] = b
        return status == 200 and bool(done(b))

    wait_until(reached, timeout, f"batch {bid} to get there", interval_s=0.5)
    return dict(seen[0])
