"""The batch API end to end: the real server on a temporary data dir, driven by the official
``openai`` SDK. The first test SIGKILLs the server (and its engine) mid-batch and starts it again
on the same data dir; the later tests use the restarted server."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import jsonschema
import openai
import pytest
from server_helpers import GRAMMARSERVE
from waiting import wait_http_ok, wait_until

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parent.parent
CHAT: Final = "/v1/chat/completions"
SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
     "required": ["n"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
     "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
     "required": ["color"], "additionalProperties": False},
]


def schema_line(i: int, cid: str | None = None, schema: dict[str, Any] | None = None) -> str:
    k = i % len(SCHEMAS)
    body = {"model": "m", "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": f"Item {i}: answer in JSON."}],
            "response_format": {"type": "json_schema", "json_schema": {
                "name": f"s{k}", "strict": schema is None, "schema": schema or SCHEMAS[k]}}}
    return json.dumps({"custom_id": cid or f"req-{i}", "method": "POST", "url": CHAT,
                       "body": body})


def check_output(text: str, expected: set[str]) -> list[dict[str, Any]]:
    """Every line is a 200 whose content validates against its line's schema; custom_ids are
    exactly ``expected``, each once."""
    lines = [json.loads(x) for x in text.splitlines()]
    ids = [x["custom_id"] for x in lines]
    assert len(ids) == len(set(ids)) and set(ids) == expected
    for x in lines:
        assert x["error"] is None and x["response"]["status_code"] == 200
        assert x["id"].startswith("batch_req_") and x["response"]["request_id"]
        choice = x["response"]["body"]["choices"][0]
        assert choice["finish_reason"] == "stop"
        i = int(x["custom_id"].split("-")[1])
        jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMAS[i % len(SCHEMAS)])
    return lines


class Server:
    """``grammarserve serve`` in its own process group (SIGKILL takes the engine down too)."""

    def __init__(self, data_dir: Path, log: Path) -> None:
        self.data_dir, self.log = data_dir, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [GRAMMARSERVE, "serve", "--port", str(port),
                 "--kv-cache-tokens", "16384", "--max-num-reqs", "16", "--num-threads", "1",
                 "--data-dir", str(self.data_dir), "--log-level", "warning"],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        wait_http_ok(self.url + "/health", 300, "the server to become healthy", self.proc,
                     self.log)

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("batch-server")
    srv = Server(d / "data", d / "server.log")
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def client(srv: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def wait_for(c: openai.OpenAI, batch_id: str, done: Callable[[Any], bool],
             timeout: float = 600) -> Any:
    def reached() -> Any:
        b = c.batches.retrieve(batch_id)
        return b if done(b) else None

    return wait_until(reached, timeout, f"batch {batch_id} to get there", interval_s=0.2)


def submit(c: openai.OpenAI, lines: list[str]) -> Any:
    f = c.files.create(file=("in.jsonl", ("\n".join(lines) + "\n").encode()), purpose="batch")
    return c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")


def test_sdk_batch_survives_sigkill_then_completes(server: Server) -> None:
    c = client(server)
    batch = submit(c, [schema_line(i) for i in range(50)])
    assert batch.status == "validating"
    wait_for(c, batch.id, lambda b: b.request_counts.completed >= 1)
    server.kill()  # mid-batch: the engine and the server die at once
    server.start()
    c = client(server)
    mid = c.batches.retrieve(batch.id)
    assert mid.status in ("in_progress", "finalizing", "completed"), mid
    assert mid.request_counts is not None
    assert 1 <= mid.request_counts.completed < 50, mid.request_counts
    done = wait_for(c, batch.id, lambda b: b.status == "completed")
    assert (done.request_counts.total, done.request_counts.completed,
            done.request_counts.failed) == (50, 50, 0)
    assert done.error_file_id is None and done.completed_at and done.in_progress_at
    check_output(c.files.content(done.output_file_id).text, {f"req-{i}" for i in range(50)})
    assert any(b.id == batch.id for b in c.batches.list(limit=5).data)


def test_bad_lines_reported_with_line_numbers(server: Server) -> None:
    c = client(server)
    bad_schema = {"type": "object", "properties": {"a": {"type": "strin"}}}
    lines = [schema_line(0), schema_line(1), "{not json", json.dumps({"url": CHAT, "body": {}}),
             schema_line(2, cid="req-0"), schema_line(3, cid="bad-schema", schema=bad_schema),
             schema_line(4)]
    batch = submit(c, lines)
    done = wait_for(c, batch.id, lambda b: b.status in ("completed", "failed"))
    assert done.status == "completed"
    assert (done.request_counts.total, done.request_counts.completed,
            done.request_counts.failed) == (7, 3, 4)
    check_output(c.files.content(done.output_file_id).text, {"req-0", "req-1", "req-4"})
    errors = {x["line"]: x for x in map(json.loads,
                                        c.files.content(done.error_file_id).text.splitlines())}
    assert sorted(errors) == [3, 4, 5, 6]
    assert [errors[n]["error"]["code"] for n in (3, 4, 5)] == [
        "invalid_json", "missing_custom_id", "duplicate_custom_id"]
    reply = errors[6]["response"]
    assert errors[6]["custom_id"] == "bad-schema" and reply["status_code"] == 400
    assert reply["body"]["error"]["message"].startswith("Invalid schema for response_format 's0'")
    assert [e.line for e in done.errors.data] == [3, 4, 5]


def test_cancel_keeps_finished_lines_downloadable(server: Server) -> None:
    c = client(server)
    lines = [json.dumps({"custom_id": f"long-{i}", "method": "POST", "url": CHAT, "body": {
        "model": "m", "max_tokens": 48, "temperature": 0, "ignore_eos": True,
        "messages": [{"role": "user", "content": f"Tell story number {i}."}]}})
        for i in range(64)]
    batch = submit(c, lines)
    wait_for(c, batch.id, lambda b: b.request_counts.completed >= 1)
    # interactive traffic is still served while the batch holds its share of the engine
    reply = c.chat.completions.create(model="m", max_tokens=4, temperature=0,
                                      messages=[{"role": "user", "content": "Hi"}])
    assert reply.choices[0].message.content is not None
    cancelling = c.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait_for(c, batch.id, lambda b: b.status == "cancelled", timeout=120)
    assert done.cancelled_at and done.cancelling_at and done.output_file_id
    out = [json.loads(x) for x in c.files.content(done.output_file_id).text.splitlines()]
    assert 1 <= len(out) < 64 and len(out) == done.request_counts.completed
    assert all(x["response"]["status_code"] == 200 for x in out)
    with pytest.raises(openai.BadRequestError, match="Cannot cancel"):
        c.batches.cancel(c.batches.list(limit=3).data[-1].id)  # the completed first batch
