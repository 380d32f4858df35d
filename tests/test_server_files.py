"""The files API's boundaries without a model (issue 36): a list cursor naming another tenant's
id, ``expires_after`` enforced (listing, retrieval, content, bytes on disk) on a clock the test
moves, and the per-tenant storage quota. Routes are driven over ASGI with the OpenAI SDK, as
in test_server_guards.py (the app has no engine: batches stay queued)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import httpx2
import openai
import pytest

from grammarserve.batch.store import BatchStore
from grammarserve.config import EngineConfig
from grammarserve.errors import ErrorKind, InvalidRequestError
from grammarserve.server import create_app
from grammarserve.server.config import ServerConfig

CHAT: Final = "/v1/chat/completions"
LINE: Final = (json.dumps({"custom_id": "a", "method": "POST", "url": CHAT, "body": {
    "model": "m", "messages": [{"role": "user", "content": "hi"}]}}) + "\n").encode()
KEYS: Final = {"sk-alice": "alice", "sk-bob": "bob"}
HOUR: Final = 3600


class Clock:
    """Wall-clock seconds the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make_app(tmp_path: Path, clock: Clock) -> Iterator[Callable[..., Any]]:
    apps: list[Any] = []

    def make(**config: Any) -> Any:
        app = create_app(ServerConfig(engine=EngineConfig(model="/nonexistent"),
                                      data_dir=tmp_path, api_keys=KEYS, **config), clock=clock)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.state.gs.status = "failed"  # lets an idle batch worker thread end


def _clients(app: Any) -> tuple[dict[str, openai.AsyncOpenAI], dict[str, httpx2.AsyncClient]]:
    """SDK clients and raw HTTP clients of alice and bob."""
    sdk, raw = {}, {}
    for key, tenant in KEYS.items():
        raw[tenant] = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app),
                                         base_url="http://test",
                                         headers={"Authorization": f"Bearer {key}"})
        sdk[tenant] = openai.AsyncOpenAI(base_url="http://test/v1", api_key=key,
                                         http_client=raw[tenant], max_retries=0)
    return sdk, raw


async def _close(raw: dict[str, httpx2.AsyncClient]) -> None:
    for http in raw.values():
        await http.aclose()


def _stored(data_dir: Path) -> set[str]:
    return {p.name for p in (data_dir / "files").iterdir()}


# -- the after= cursor ---------------------------------------------------------------------------
def test_another_tenants_id_as_cursor_pages_as_an_unknown_id(make_app: Any) -> None:
    """Bob's file and batch ids, given as alice's ``after=``, answer exactly what an id that
    exists nowhere answers (an empty page): nothing says that bob's ids exist, nor where they
    stand among alice's."""
    app = make_app()

    async def go() -> None:
        sdk, raw = _clients(app)
        alice, bob = sdk["alice"], sdk["bob"]
        a0 = await alice.files.create(file=("a0.jsonl", LINE), purpose="batch")
        a1 = await alice.files.create(file=("a1.jsonl", LINE), purpose="batch")
        ab0 = await alice.batches.create(input_file_id=a0.id, endpoint=CHAT,
                                         completion_window="24h")
        b0 = await bob.files.create(file=("b0.jsonl", LINE), purpose="batch")
        bb0 = await bob.batches.create(input_file_id=b0.id, endpoint=CHAT,
                                       completion_window="24h")
        await alice.files.create(file=("a2.jsonl", LINE), purpose="batch")
        await alice.batches.create(input_file_id=a1.id, endpoint=CHAT, completion_window="24h")
        for path, theirs, unknown in (("/v1/files", b0.id, "file-doesnotexist"),
                                      ("/v1/batches", bb0.id, "batch_doesnotexist")):
            as_unknown = await raw["alice"].get(path, params={"after": unknown})
            as_theirs = await raw["alice"].get(path, params={"after": theirs})
            assert as_unknown.status_code == as_theirs.status_code == 200
            assert as_theirs.json() == as_unknown.json() == {
                "object": "list", "data": [], "first_id": None, "last_id": None,
                "has_more": False}
            # alice's own ids page as before
            mine = (await raw["alice"].get(path, params={"limit": 1})).json()
            rest = (await raw["alice"].get(path, params={"after": mine["last_id"]})).json()
            assert mine["has_more"] and rest["data"] and not rest["has_more"]
            assert theirs not in {x["id"] for x in rest["data"]}
        assert [b.id for b in (await alice.batches.list()).data][1:] == [ab0.id]
        await _close(raw)

    asyncio.run(go())


# -- expires_after -------------------------------------------------------------------------------
def test_expires_after_is_reported_and_enforced(make_app: Any, clock: Clock,
                                                 tmp_path: Path) -> None:
    """A file past its ``expires_at`` is not listed, not retrievable, its content not
    downloadable (404, OpenAI's envelope), not usable as a batch input, and its bytes are gone;
    files without a policy keep OpenAI's defaults (purpose batch: 30 days; others: none)."""
    app = make_app()

    async def go() -> None:
        sdk, raw = _clients(app)
        alice = sdk["alice"]
        short = await alice.files.create(file=("s.jsonl", LINE), purpose="batch",
                                         expires_after={"anchor": "created_at",
                                                        "seconds": HOUR})
        batch = await alice.files.create(file=("b.jsonl", LINE), purpose="batch")
        kept = await alice.files.create(file=("u.jsonl", LINE), purpose="user_data")
        assert short.created_at == int(clock.now) and short.expires_at == short.created_at + HOUR
        assert batch.expires_at == batch.created_at + 30 * 24 * HOUR
        assert kept.expires_at is None
        assert (await alice.files.content(short.id)).content == LINE  # not expired yet
        clock.now += HOUR - 1
        assert (await alice.files.retrieve(short.id)).id == short.id
        clock.now += 1  # expires_at reached
        assert short.id not in _ids((await raw["alice"].get("/v1/files")).json())
        for method, path in (("GET", f"/v1/files/{short.id}"),
                             ("GET", f"/v1/files/{short.id}/content"),
                             ("DELETE", f"/v1/files/{short.id}")):
            r = await raw["alice"].request(method, path)
            assert r.status_code == 404, (method, path)
            assert r.json()["error"]["type"] == "not_found_error"
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        with pytest.raises(openai.BadRequestError, match="input_file_id"):
            await alice.batches.create(input_file_id=short.id, endpoint=CHAT,
                                       completion_window="24h")
        assert short.id not in _stored(tmp_path)  # its bytes were removed
        assert {batch.id, kept.id} <= _stored(tmp_path)
        clock.now += 30 * 24 * HOUR  # the batch file's default expiry; user_data stays
        assert _ids((await raw["alice"].get("/v1/files")).json()) == [kept.id]
        assert _stored(tmp_path) == {kept.id}
        await _close(raw)

    asyncio.run(go())


def test_expired_files_are_swept_without_being_touched(tmp_path: Path, clock: Clock) -> None:
    """A sweep removes every expired file of every tenant, except the input of a batch still
    running (hidden from the API, its bytes kept until the batch ends); a store opened later
    sweeps too."""
    store = BatchStore(tmp_path, clock=clock)
    gone = store.create_file("g.jsonl", "batch", LINE, tenant="bob", expires_after=HOUR)
    used = store.create_file("u.jsonl", "batch", LINE, tenant="alice", expires_after=HOUR)
    batch = store.create_batch(used["id"], CHAT, "24h", None, tenant="alice")
    clock.now += HOUR
    assert store.sweep_expired() == 1
    assert not Path(gone["path"]).exists() and Path(used["path"]).exists()
    assert store.get_file(used["id"], tenant="alice") is None  # hidden from the API
    row = store.get_file(used["id"], tenant="alice", include_expired=True)
    assert row is not None  # the worker still reads it
    assert store.set_status(batch["id"], "cancelled")
    store.close()
    again = BatchStore(tmp_path, clock=clock)
    assert not Path(used["path"]).exists()
    assert again.get_file(used["id"], tenant="alice", include_expired=True) is None
    again.close()


@pytest.mark.parametrize("fields, param", [
    ({"expires_after[anchor]": "last_active_at", "expires_after[seconds]": "3600"},
     "expires_after.anchor"),
    ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "60"},
     "expires_after.seconds"),
    ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "2592001"},
     "expires_after.seconds"),
    ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "1h"},
     "expires_after.seconds"),
    ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "³⁶⁰⁰"},
     "expires_after.seconds"),
    ({"expires_after[anchor]": "created_at"}, "expires_after.seconds"),
])
def test_a_bad_expiry_policy_is_a_400_naming_it(make_app: Any, tmp_path: Path,
                                                fields: dict[str, str], param: str) -> None:
    app = make_app()

    async def go() -> None:
        _, raw = _clients(app)
        r = await raw["alice"].post("/v1/files", data={"purpose": "batch", **fields},
                                    files={"file": ("in.jsonl", LINE)})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.json()
        await _close(raw)

    asyncio.run(go())
    assert _stored(tmp_path) == set()


# -- the storage quota ---------------------------------------------------------------------------
def test_an_upload_past_the_tenants_quota_is_refused(make_app: Any, tmp_path: Path,
                                                     clock: Clock) -> None:
    """Uploads and batch outputs count against their tenant's ``max_tenant_bytes``; an upload
    that would pass it is a 413 naming the quota and the bytes, and leaves nothing on disk;
    another tenant has its own quota; deleting a file makes room."""
    quota = 10 * len(LINE)
    app = make_app(max_tenant_bytes=quota)

    async def go() -> None:
        sdk, raw = _clients(app)
        alice, bob = sdk["alice"], sdk["bob"]
        first = await alice.files.create(file=("a.jsonl", LINE * 6), purpose="batch")
        before = _stored(tmp_path)
        with pytest.raises(openai.APIStatusError) as e:
            await alice.files.create(file=("b.jsonl", LINE * 5), purpose="batch")
        assert e.value.status_code == 413
        err: Any = e.value.body
        assert err["code"] == "storage_quota_exceeded" and err["param"] == "file"
        for number in (quota, 6 * len(LINE)):  # the quota, the bytes already used
            assert str(number) in err["message"], err["message"]
        assert _stored(tmp_path) == before  # nothing kept, not even a .part
        assert (await bob.files.create(file=("b.jsonl", LINE * 6), purpose="batch")).id
        await alice.files.create(file=("c.jsonl", LINE * 4), purpose="batch")  # exactly full
        await alice.files.delete(first.id)
        assert (await alice.files.create(file=("d.jsonl", LINE * 5), purpose="batch")).id
        # a batch's output is alice's too: the worker registers it as her file
        store = BatchStore(tmp_path, clock=clock)
        out = store.batch_dir("batch_x") / "output.jsonl"
        out.write_bytes(LINE)
        store.register_file(out, "batch_x_output.jsonl", "batch_output", tenant="alice")
        store.close()
        with pytest.raises(openai.APIStatusError) as e:
            await alice.files.create(file=("e.jsonl", LINE), purpose="batch")
        assert e.value.status_code == 413
        await _close(raw)

    asyncio.run(go())


def test_concurrent_uploads_cannot_both_pass_the_quota(tmp_path: Path) -> None:
    """Two uploads that each fit when they started: the quota is checked again with the insert,
    so the second one to commit is refused, and its bytes removed."""
    store, limit = BatchStore(tmp_path), 3 * len(LINE)
    started = [store.quota("alice", limit) for _ in range(2)]
    assert all(q.used == 0 for q in started)
    parts = []
    for _ in started:
        file_id, tmp = store.new_upload()
        tmp.write_bytes(LINE * 2)
        parts.append((file_id, tmp))
    store.commit_upload(*parts[0], "a.jsonl", "batch", tenant="alice", max_tenant_bytes=limit)
    with pytest.raises(InvalidRequestError) as e:
        store.commit_upload(*parts[1], "b.jsonl", "batch", tenant="alice",
                            max_tenant_bytes=limit)
    assert e.value.kind is ErrorKind.QUOTA_EXCEEDED and e.value.param == "file"
    assert _stored(tmp_path) == {parts[0][0]}
    store.close()


def test_expired_files_free_their_quota(make_app: Any, clock: Clock) -> None:
    app = make_app(max_tenant_bytes=2 * len(LINE))

    async def go() -> None:
        sdk, raw = _clients(app)
        alice = sdk["alice"]
        await alice.files.create(file=("a.jsonl", LINE * 2), purpose="batch",
                                 expires_after={"anchor": "created_at", "seconds": HOUR})
        with pytest.raises(openai.APIStatusError):
            await alice.files.create(file=("b.jsonl", LINE), purpose="batch")
        clock.now += HOUR
        assert (await alice.files.create(file=("b.jsonl", LINE * 2), purpose="batch")).id
        await _close(raw)

    asyncio.run(go())


def test_a_chunked_upload_past_the_quota_stops_early(make_app: Any, tmp_path: Path) -> None:
    """Without a Content-Length the upload is counted as it arrives: refused at the first
    chunk past the quota, not after the whole body."""
    app = make_app(max_tenant_bytes=10_000)
    head = (b'--B\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            b'--B\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n')
    chunks = [head] + [b"y" * 4096] * 50 + [b"\r\n--B--\r\n"]
    sent = 0

    async def body() -> Any:
        nonlocal sent
        for c in chunks:
            sent += 1
            yield c

    async def go() -> None:
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app),
                                      base_url="http://test") as http:
            r = await http.post("/v1/files", content=body(), headers={
                "Authorization": "Bearer sk-alice",
                "Content-Type": "multipart/form-data; boundary=B"})
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == "storage_quota_exceeded"

    asyncio.run(go())
    assert _stored(tmp_path) == set()
    assert sent < 10


def _ids(page: dict[str, Any]) -> list[str]:
    return [x["id"] for x in page["data"]]
