"""API keys, tenants and request limits against the real server (one start for the module):
requests without a valid key get 401; tenant A cannot see tenant B's files, batches or cached
prefixes; oversized bodies get 413, over-long prompts and too many choices a 400 naming the
parameter, all before any tokenizing."""

from __future__ import annotations

import http.client
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from batch_http import CHAT, start_batch, upload, wait_batch
from serverproc import ServerProcess, request

pytestmark = pytest.mark.model

ALICE = {"Authorization": "Bearer sk-alice-0001"}
BOB = {"Authorization": "Bearer sk-bob-0002"}
OPEN = {"Authorization": "Bearer sk-shared-0003"}  # a key without a tenant
SYSTEM = "You are a careful assistant who answers in one short sentence. " * 12


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("keys")
    keys = tmp / "keys.txt"
    keys.write_text("# tenants\nsk-alice-0001 alice\nsk-bob-0002 bob\n")
    srv = ServerProcess(tmp / "server.log", "--api-keys-file", str(keys),
                        "--api-key", "sk-shared-0003", "--data-dir", str(tmp / "data"),
                        "--kv-cache-tokens", "16384", "--max-num-reqs", "8")
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def cached(srv: ServerProcess, headers: dict[str, str], **extra: Any) -> int:
    body = {"model": "m", "max_tokens": 2, "temperature": 0, **extra,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": "Name a colour."}]}
    status, reply = request("POST", srv.url + CHAT, body, headers=headers)
    assert status == 200, reply
    return int(reply["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_requests_need_a_known_key(server: ServerProcess) -> None:
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    status, err = request("POST", server.url + CHAT, body)
    assert status == 401 and err["error"]["type"] == "invalid_request_error"
    assert err["error"]["code"] is None and err["error"]["param"] is None
    status, err = request("POST", server.url + CHAT, body,
                          headers={"Authorization": "Bearer sk-alice-0002"})
    assert status == 401 and err["error"]["code"] == "invalid_api_key"
    assert request("GET", server.url + "/v1/files")[0] == 401
    assert request("GET", server.url + "/health") == (200, {"status": "ok"})
    assert request("GET", server.url + "/metrics")[0] == 200
    assert request("POST", server.url + CHAT, body, headers=OPEN)[0] == 200


def test_tenants_do_not_share_cached_prefixes(server: ServerProcess) -> None:
    cached(server, ALICE)  # alice's prompt (~160 tokens) is now in the radix cache
    # the others find at most what they sent themselves before (the template's first tokens)
    assert cached(server, BOB) < 16
    assert cached(server, BOB, cache_namespace="alice") < 16
    assert cached(server, OPEN) < 16
    assert cached(server, OPEN, cache_namespace="alice") < 16
    assert cached(server, ALICE) > 100  # the prefix was there all along, for alice
    status, err = request("POST", server.url + CHAT, {
        "model": "m", "max_tokens": 2, "cache_namespace": "alice\u0000",
        "messages": [{"role": "user", "content": "hi"}]}, headers=OPEN)
    assert status == 400 and err["error"]["param"] == "cache_namespace"


def test_tenants_do_not_see_each_others_files_and_batches(server: ServerProcess) -> None:
    url = server.url
    status, f = upload(url, b"{}\n", ALICE)
    assert status == 200
    bid = start_batch(url, 2, ALICE)
    for path in (f"/v1/files/{f['id']}", f"/v1/files/{f['id']}/content",
                 f"/v1/batches/{bid}"):
        assert request("GET", url + path, headers=BOB)[0] == 404
        assert request("GET", url + path, headers=OPEN)[0] == 404
        assert request("GET", url + path, headers=ALICE)[0] == 200
    assert request("POST", f"{url}/v1/batches/{bid}/cancel", {}, headers=BOB)[0] == 404
    assert request("DELETE", f"{url}/v1/files/{f['id']}", headers=BOB)[0] == 404
    status, page = request("GET", url + "/v1/files", headers=BOB)
    assert status == 200 and page["data"] == []
    status, page = request("GET", url + "/v1/batches", headers=BOB)
    assert status == 200 and page["data"] == []
    done = wait_batch(url, bid, lambda b: b["status"] == "completed", headers=ALICE)
    out = f"{url}/v1/files/{done['output_file_id']}/content"
    assert request("GET", out, headers=BOB)[0] == 404
    status, text = request("GET", out, headers=ALICE)
    assert status == 200 and len(text.splitlines()) == 2


def _post_raw(srv: ServerProcess, path: str, body: bytes, *, chunked: bool = False
              ) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=300)
    headers = {"Content-Type": "application/json", **ALICE}
    if chunked:
        chunks = (body[i:i + 65536] for i in range(0, len(body), 65536))
        conn.request("POST", path, body=chunks, headers=headers, encode_chunked=True)
    else:
        conn.request("POST", path, body=body, headers=headers)
    r = conn.getresponse()
    return r.status, json.loads(r.read())


def test_size_limits(server: ServerProcess) -> None:
    huge = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 10**7}]})
    for chunked in (False, True):
        status, err = _post_raw(server, CHAT, huge.encode(), chunked=chunked)
        assert status == 413 and err["error"]["code"] == "request_too_large"
    long = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 10**6}]})
    status, err = _post_raw(server, CHAT, long.encode())
    assert status == 400 and err["error"]["code"] == "context_length_exceeded"
    assert "at most 663552" in err["error"]["message"]  # 8192 tokens x 81 bytes
    too_many: list[tuple[dict[str, Any], str]] = [
        ({"prompt": ["a"] * 600}, "prompt"), ({"prompt": ["a"] * 40, "n": 16}, "n")]
    for body, param in too_many:
        status, err = _post_raw(server, "/v1/completions",
                                json.dumps({"model": "m", **body}).encode())
        assert status == 400 and err["error"]["param"] == param, err
