"""The server's guards without a model: the restart budget, API keys and tenants, the body,
upload, prompt and choices limits. Routes are driven over ASGI (the app has no engine: it stays
"loading"), middlewares with a hand-fed ``receive`` so a body can arrive in chunks."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx2
import openai
import pytest
from fastapi.routing import iter_route_contexts

from grammarserve.config import EngineConfig
from grammarserve.errors import ErrorKind, InvalidRequestError
from grammarserve.openai.limits import check_choices, prompt_texts, text_chars
from grammarserve.openai.tenancy import tenant_namespace
from grammarserve.server import create_app
from grammarserve.server.auth import ApiKeyAuth, load_api_keys
from grammarserve.server.config import RestartPolicy, ServerConfig
from grammarserve.server.limits import BodyLimit
from grammarserve.server.supervisor import RestartBudget

CHAT: Final = "/v1/chat/completions"
LINE = json.dumps({"custom_id": "a", "method": "POST", "url": CHAT, "body": {
    "model": "m", "messages": [{"role": "user", "content": "hi"}]}}) + "\n"


# -- restart budget ---------------------------------------------------------------------------
def test_restart_budget_backs_off_then_gives_up() -> None:
    now = [0.0]
    budget = RestartBudget(RestartPolicy(max_restarts=3, window_s=100, backoff_s=1,
                                         max_backoff_s=3), clock=lambda: now[0])
    assert [budget.on_death() for _ in range(3)] == [1.0, 2.0, 3.0]  # doubled, capped
    assert budget.on_death() is None  # a 4th death within the window
    now[0] = 500.0  # the window has slid past them all
    assert budget.on_death() == 1.0
    assert RestartBudget(RestartPolicy(max_restarts=0)).on_death() is None
    with pytest.raises(InvalidRequestError):
        RestartPolicy(max_restarts=-1)


# -- API keys -----------------------------------------------------------------------------------
def test_keys_from_flags_and_file(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text("# team keys\nsk-a1 alice\n\n  sk-b1   bob  \nsk-open\n")
    assert load_api_keys(["sk-x", "sk-a2 alice"], f) == {
        "sk-x": "", "sk-a2": "alice", "sk-a1": "alice", "sk-b1": "bob", "sk-open": ""}
    for bad, match in [(["k a b"], "3 fields"), (["k bad/tenant"], "tenant"), ([""], "empty"),
                       (["k a", "k b"], "different tenants")]:
        with pytest.raises(InvalidRequestError, match=match):
            load_api_keys(bad)
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(InvalidRequestError, match="no API key"):
        load_api_keys([], tmp_path / "empty")


def test_key_lookup_is_by_value() -> None:
    auth = ApiKeyAuth(lambda *_: None, {"sk-a": "alice", "sk-b": "", "sk-a-longer": "x"})  # type: ignore[arg-type,return-value]
    assert [auth.tenant(k) for k in ("sk-a", "sk-b", "sk-a-longer", "sk-", "SK-A")] == [
        "alice", "", "x", None, None]


def test_tenant_namespaces_cannot_be_forged() -> None:
    assert tenant_namespace("", "mine") == "mine"
    assert tenant_namespace("alice", "") != tenant_namespace("", "alice")
    assert tenant_namespace("alice", "x") != tenant_namespace("bob", "x")
    with pytest.raises(InvalidRequestError, match="NUL"):
        tenant_namespace("", "alice\x00")


# -- routes over ASGI ---------------------------------------------------------------------------
def _app(tmp_path: Path, **config: Any) -> Any:
    return create_app(ServerConfig(engine=EngineConfig(model="/nonexistent"),
                                   data_dir=tmp_path, **config))


@pytest.fixture
def keyed(tmp_path: Path) -> Iterator[Any]:
    app = _app(tmp_path, api_keys={"sk-alice": "alice", "sk-bob": "bob"})
    yield app
    app.state.gs.status = "failed"  # lets an idle batch worker thread end


def _client(app: Any, key: str) -> tuple[openai.AsyncOpenAI, httpx2.AsyncClient]:
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test")
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key=key, http_client=http,
                              max_retries=0), http


def test_keys_required_except_health_and_metrics(keyed: Any) -> None:
    async def go() -> None:
        _, http = _client(keyed, "unused")
        r = await http.get("/v1/files")
        assert r.status_code == 401 and r.json() == {"error": {
            "message": r.json()["error"]["message"], "type": "invalid_request_error",
            "param": None, "code": None}}
        assert "Authorization: Bearer" in r.json()["error"]["message"]
        r = await http.get("/v1/files", headers={"Authorization": "Bearer sk-mallory-1234"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert "sk-mallory" not in r.json()["error"]["message"]  # the key is masked
        r = await http.post(CHAT, headers={"Authorization": "Basic sk-alice"}, json={})
        assert r.status_code == 401
        assert (await http.get("/health")).status_code == 503  # open (and still loading)
        assert (await http.get("/metrics")).status_code == 200
        ok = await http.get("/v1/files", headers={"Authorization": "Bearer sk-alice"})
        assert ok.status_code == 200
        await http.aclose()

    asyncio.run(go())


#: Routes that answer without a key by design (probes and Prometheus scrapers carry none).
PUBLIC_ROUTES: Final = {("GET", "/health"), ("GET", "/metrics")}


def test_every_route_but_the_public_ones_needs_a_key(keyed: Any) -> None:
    """Walks every route of the app (included routers too), so a new route is covered as soon
    as it exists: without a key, or with a wrong one, each answers 401 with OpenAI's envelope
    before anything else happens (path parameters filled with a dummy, no body)."""
    seen: set[tuple[str, str]] = set()
    for route in iter_route_contexts(keyed.routes):
        assert route.path_format and route.methods, f"a route the walk cannot call: {route}"
        path = re.sub(r"\{[^}]+\}", "x", route.path_format)
        seen |= {(m, path) for m in route.methods}
    assert {("POST", CHAT), ("GET", "/v1/files/x/content"), ("POST", "/v1/batches/x/cancel"),
            ("GET", "/v1/models/x"), ("GET", "/openapi.json")} <= seen  # the walk found them
    assert PUBLIC_ROUTES <= seen  # a public route renamed must be listed again

    async def go() -> None:
        _, http = _client(keyed, "unused")
        for method, path in sorted(seen - PUBLIC_ROUTES):
            for headers, code in (({}, None), ({"Authorization": "Bearer sk-wrong-0000"},
                                               "invalid_api_key")):
                r = await http.request(method, path, headers=headers)
                assert r.status_code == 401, (method, path, headers, r.status_code)
                assert r.headers["www-authenticate"].startswith("Bearer")
                if method != "HEAD":
                    error = r.json()["error"]
                    assert error == {"message": error["message"],
                                     "type": "invalid_request_error", "param": None,
                                     "code": code}, (method, path)
        for method, path in sorted(PUBLIC_ROUTES):
            assert (await http.request(method, path)).status_code != 401, (method, path)
        await http.aclose()

    asyncio.run(go())


def test_tenants_see_only_their_files_and_batches(keyed: Any) -> None:
    async def go() -> None:
        alice, ah = _client(keyed, "sk-alice")
        bob, bh = _client(keyed, "sk-bob")
        f = await alice.files.create(file=("in.jsonl", LINE.encode()), purpose="batch")
        b = await alice.batches.create(input_file_id=f.id, endpoint=CHAT,
                                       completion_window="24h")
        assert [x.id for x in (await alice.files.list()).data] == [f.id]
        assert (await bob.files.list()).data == [] and (await bob.batches.list()).data == []
        for call in (bob.files.retrieve(f.id), bob.files.content(f.id), bob.files.delete(f.id),
                     bob.batches.retrieve(b.id), bob.batches.cancel(b.id)):
            with pytest.raises(openai.NotFoundError):
                await call
        with pytest.raises(openai.BadRequestError, match="input_file_id"):
            await bob.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
        assert (await alice.files.content(f.id)).content == LINE.encode()
        assert (await alice.batches.retrieve(b.id)).id == b.id
        await ah.aclose()
        await bh.aclose()

    asyncio.run(go())


def test_models_is_503_without_an_engine(tmp_path: Path) -> None:
    app = _app(tmp_path)

    async def go() -> None:
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app),
                                      base_url="http://test") as http:
            r = await http.get("/v1/models")
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"

    asyncio.run(go())


def test_declared_oversized_upload_is_413(tmp_path: Path) -> None:
    app = _app(tmp_path, max_upload_bytes=1000)

    async def go() -> None:
        client, http = _client(app, "x")
        with pytest.raises(openai.APIStatusError) as e:
            await client.files.create(file=("in.jsonl", LINE.encode() * 200), purpose="batch")
        assert e.value.status_code == 413
        assert e.value.body["code"] == "request_too_large"  # type: ignore[index]
        f = await client.files.create(file=("in.jsonl", LINE.encode()), purpose="batch")
        assert f.bytes == len(LINE)
        await http.aclose()

    asyncio.run(go())
    app.state.gs.status = "failed"
    assert [p.name for p in (tmp_path / "files").iterdir()] == [f"{_only_file(tmp_path)}"]


def _only_file(data_dir: Path) -> str:
    names = [p.name for p in (data_dir / "files").iterdir()]
    assert len(names) == 1 and not names[0].endswith(".part"), names
    return names[0]


# -- bodies arriving in chunks (no Content-Length) ----------------------------------------------
async def _call(app: Any, path: str, chunks: list[bytes], headers: dict[str, str],
                ) -> tuple[int, dict[str, Any]]:
    """One POST through ``app`` with the body in ``chunks`` (as a chunked upload arrives);
    returns the status and JSON body. Counts what the app read."""
    pending = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
               for i, c in enumerate(chunks)]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop(0)
        await asyncio.sleep(3600)  # a client that waits for the answer
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": [(k.lower().encode(), v.encode())
                                              for k, v in headers.items()],
             "http_version": "1.1", "scheme": "http", "server": ("test", 80),
             "client": ("test", 1), "root_path": ""}
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    _call.unread = len(pending)  # type: ignore[attr-defined]
    return status, json.loads(body)


def test_chunked_body_over_the_limit_is_413_before_it_is_all_read() -> None:
    async def inner(scope: Any, receive: Any, send: Any) -> None:
        msg = await receive()
        data = json.dumps({"len": len(msg["body"]), "more": msg["more_body"]}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": data})

    app = BodyLimit(inner, max_bytes=100)
    status, body = asyncio.run(_call(app, CHAT, [b"x" * 60] * 20, {}))
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert _call.unread == 18  # type: ignore[attr-defined]  # stopped at the 2nd chunk
    status, body = asyncio.run(_call(app, CHAT, [b"x" * 40] * 2, {}))
    assert (status, body) == (200, {"len": 80, "more": False})  # handed over in one piece
    status, _ = asyncio.run(_call(app, CHAT, [b"x"], {"Content-Length": "101"}))
    assert status == 413


def test_chunked_upload_over_the_limit_is_413_and_leaves_nothing(tmp_path: Path) -> None:
    app = _app(tmp_path, max_upload_bytes=10_000, max_body_bytes=100)
    head = (b'--B\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            b'--B\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n')
    ctype = {"Content-Type": "multipart/form-data; boundary=B"}
    status, body = asyncio.run(_call(app, "/v1/files", [head] + [b"y" * 4096] * 50, ctype))
    assert status == 413 and body["error"]["param"] == "file"
    assert _call.unread > 40  # type: ignore[attr-defined]
    assert list((tmp_path / "files").iterdir()) == []
    # the upload's own limit applies, not max_body_bytes; a body cut short is a 400
    status, _ = asyncio.run(_call(app, "/v1/files", [head, b"y" * 5000 + b"\r\n--B--\r\n"],
                                  ctype))
    assert status == 200
    status, body = asyncio.run(_call(app, "/v1/files", [head, b"y" * 50], ctype))
    assert status == 400 and "closing boundary" in body["error"]["message"]
    _only_file(tmp_path)
    app.state.gs.status = "failed"


# -- request-size checks of the protocol layer ---------------------------------------------------
def test_choices_limit_names_the_parameter() -> None:
    check_choices(8, 16, 128)
    with pytest.raises(InvalidRequestError) as e:
        check_choices(600, 1, 128)
    assert e.value.param == "prompt" and e.value.kind is ErrorKind.INVALID_REQUEST
    with pytest.raises(InvalidRequestError) as e:
        check_choices(40, 16, 128)
    assert e.value.param == "n" and "640" in str(e.value)
    assert prompt_texts("a") == (1, ["a"]) and prompt_texts([1, 2]) == (1, [])
    assert prompt_texts(["a", "b"]) == (2, ["a", "b"]) and prompt_texts([[1], [2]]) == (2, [])
    assert ServerConfig(max_pending_requests=3).request_choices_limit == 3


def test_text_chars_walks_any_depth() -> None:
    deep: Any = "abc"
    for _ in range(50_000):  # far deeper than Python's recursion limit
        deep = {"k": [deep]}
    assert text_chars(deep) == 3 + 50_000


def test_loopback_hosts_are_told_apart() -> None:
    from grammarserve.cli import _loopback

    assert all(_loopback(h) for h in ("127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost"))
    assert not any(_loopback(h) for h in ("0.0.0.0", "::", "10.1.2.3", "example.com"))
