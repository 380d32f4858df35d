"""Fuzzing the real server with schemathesis, from its own OpenAPI document (``/openapi.json``).

Each operation of the chat, completions, responses, tokenize and batch routes gets bodies,
queries and path parameters generated from the document, both valid ones (positive) and ones that
break it (negative). Every reply must be below 500, and every error must be the OpenAI envelope
(``{"error": {"message", "type", "param", "code"}}``, never FastAPI's 422). At the end the
server process must still be alive, ``/health`` must answer 200 and a normal request must work.

The run is bounded: generated ``max_tokens`` / ``max_completion_tokens`` /
``max_output_tokens`` are folded into ``[1, MAX_TOKENS]`` (an absent or null one is set to
``MAX_TOKENS``), so no request can ask for thousands of tokens. Examples per operation and mode:
``GRAMMARSERVE_FUZZ_EXAMPLES`` (CI: 6); the longer run of the closing note is
``GRAMMARSERVE_FUZZ_EXAMPLES=500 pytest tests/test_fuzz_openapi.py``. ``GRAMMARSERVE_FUZZ_URL=http://host:port`` fuzzes a server that is
already running instead of starting one.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from server_helpers import GRAMMARSERVE
from waiting import wait_http_ok

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = int(os.environ.get("GRAMMARSERVE_FUZZ_EXAMPLES", "6"))
LONG = EXAMPLES > 50
MAX_TOKENS = 4
#: (method, path) fuzzed: the generating routes, tokenize and the batch API.
OPERATIONS = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/responses"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("POST", "/v1/files"),
    ("GET", "/v1/files"),
    ("GET", "/v1/files/{file_id}"),
    ("GET", "/v1/files/{file_id}/content"),
    ("DELETE", "/v1/files/{file_id}"),
    ("POST", "/v1/batches"),
    ("GET", "/v1/batches"),
    ("GET", "/v1/batches/{batch_id}"),
    ("POST", "/v1/batches/{batch_id}/cancel"),
]
GENERATING = {"/v1/chat/completions", "/v1/completions", "/v1/responses"}
#: Requests sent, by operation, mode and status (printed at the end with ``-s``).
COUNTS: Counter[tuple[str, str, int]] = Counter()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request(url: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``{"url", "proc"}``: a server on the embedded model with its own data dir (or the one
    ``GRAMMARSERVE_FUZZ_URL`` names, with ``proc`` None)."""
    if os.environ.get("GRAMMARSERVE_FUZZ_URL"):
        yield {"url": os.environ["GRAMMARSERVE_FUZZ_URL"].rstrip("/"), "proc": None}
        return
    port = _free_port()
    tmp = tmp_path_factory.mktemp("fuzz")
    log = tmp / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [GRAMMARSERVE, "serve", "--model", "default",
             "--port", str(port), "--kv-cache-tokens", "16384", "--max-n", "4",
             "--num-threads", "1", "--data-dir", str(tmp / "data"), "--log-level", "warning"],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(url + "/health", 300, "the server to become ready", proc, log)
        yield {"url": url, "proc": proc, "log": log}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def api(server: dict[str, Any]) -> Any:
    """The server's own OpenAPI document, loaded by schemathesis."""
    return schemathesis.openapi.from_url(server["url"] + "/openapi.json")


def _bound(path: str, body: Any) -> None:
    """Keep a generated completion short: fold ``max_tokens`` / ``max_completion_tokens`` into
    ``[1, MAX_TOKENS]`` and set one when none is given (invalid values are left as they are)."""
    if path not in GENERATING or not isinstance(body, dict):
        return
    keys = (("max_tokens", "max_completion_tokens") if "chat" in path else
            ("max_output_tokens",) if "responses" in path else ("max_tokens",))
    for key in keys:
        value = body.get(key)
        if type(value) is int and value > MAX_TOKENS:
            body[key] = 1 + value % MAX_TOKENS
        elif type(value) is float and value > MAX_TOKENS:  # 1e300 would parse as an int
            body[key] = float(MAX_TOKENS)
    if all(body.get(key) is None for key in keys):
        body[keys[0]] = MAX_TOKENS


def _check_errors(status: int, content_type: str, text: str) -> None:
    """Errors are the OpenAI envelope, client mistakes 400/404, and a stream has no error event
    of the server's own making."""
    if status >= 400:
        assert status in (400, 404), (status, text)
        err = json.loads(text)["error"]
        assert set(err) == {"message", "type", "param", "code"}, err
        assert isinstance(err["message"], str) and err["message"], err
        return
    if content_type.startswith("text/event-stream"):
        for line in text.splitlines():
            if line.startswith("data: {") and '"error"' in line:
                event = json.loads(line[6:])
                err = event.get("error")
                assert not err or err.get("type") != "server_error", line
                # the Responses API's typed error event
                assert event.get("type") != "error" or event["code"] != "server_error", line


#: Operations whose only input is a string path parameter have no invalid input to generate.
CASES = [(m, p, mode) for m, p in OPERATIONS for mode in ("positive", "negative")
         if mode == "positive" or not (m != "POST" and "{" in p) and not p.endswith("/cancel")]


@pytest.mark.parametrize(("method", "path", "mode"), CASES,
                         ids=[f"{m} {p} {mode}" for m, p, mode in CASES])
def test_no_server_error(api: Any, server: dict[str, Any], method: str, path: str,
                         mode: str) -> None:
    operation = api[path][method]
    generation = GenerationMode.POSITIVE if mode == "positive" else GenerationMode.NEGATIVE

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=not LONG,
              phases=[Phase.explicit, Phase.generate], 
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=generation))
    def run(case: Any) -> None:
        _bound(path, case.body)
        response = case.call(base_url=server["url"], timeout=120)
        COUNTS[(f"{method} {path}", mode, response.status_code)] += 1
        case.validate_response(response, checks=[not_a_server_error])
        content_type = (response.headers.get("content-type") or [""])[0]
        _check_errors(response.status_code, content_type, response.text)

    run()


def test_lone_surrogates_are_refused(server: dict[str, Any]) -> None:
    """Found fuzzing: a JSON ``\\ud800`` escape (a lone surrogate) was a 500 (the tokenizer, and
    SQLite for a batch), and one in a batch's metadata was stored, so that every later
    GET /v1/batches answered 500. Each is now a 400 naming the field."""
    url = server["url"]
    for path, body, param in [
        ("/v1/chat/completions", {"model": "m", "max_tokens": 1,
                                  "messages": [{"role": "user", "content": "a\ud800"}]},
         "messages[0].content"),
        ("/v1/completions", {"model": "m", "max_tokens": 1, "prompt": "\udc00"}, "prompt"),
        ("/tokenize", {"prompt": "\ud800"}, "prompt"),
        ("/v1/batches", {"input_file_id": "\ud800", "endpoint": "/v1/completions"},
         "input_file_id"),
        ("/v1/batches", {"input_file_id": "file-x", "endpoint": "/v1/completions",
                         "metadata": {"k": "\ud800"}}, "metadata"),
    ]:
        status, reply = _request(url + path, body)
        assert status == 400 and reply["error"]["param"] == param, (path, reply)
    assert _request(url + "/v1/batches")[0] == 200


def test_server_survived(server: dict[str, Any]) -> None:
    """After the fuzzing: the process is alive, healthy, and still answers normal requests."""
    if server["proc"] is not None:
        assert server["proc"].poll() is None, server["log"].read_text()
    assert _request(server["url"] + "/health") == (200, {"status": "ok"})
    status, reply = _request(server["url"] + "/v1/chat/completions", {
        "model": "m", "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": "Name the capital of France."}]})
    assert status == 200, reply
    assert reply["choices"][0]["message"]["content"]
    status, reply = _request(server["url"] + "/v1/completions", {
        "model": "m", "prompt": "1, 2, 3,", "max_tokens": 4, "temperature": 0,
        "regex": r" [0-9]+"})
    assert status == 200, reply
    assert reply["choices"][0]["text"].strip().isdigit(), reply
    if COUNTS:
        by_op: Counter[str] = Counter()
        by_status: Counter[int] = Counter()
        for (op, _, status), k in COUNTS.items():
            by_op[op] += k
            by_status[status] += k
        print(f"\nfuzzed requests: {sum(by_op.values())}, statuses {dict(by_status)}")
        for (op, mode, status), k in sorted(COUNTS.items()):
            print(f"  {op:36} {mode:8} {status}: {k}")
