"""Batch API pieces without the model: input lines, durable result files, the SQLite store, and
the /v1/files + /v1/batches routes driven by the official ``openai`` SDK over ASGI."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Final

import httpx2
import openai
import pytest

from grammarserve.batch.lines import error_line, index_input, response_line
from grammarserve.batch.results import ResultFile, recover, scan, todo_lines
from grammarserve.batch.store import BatchStore
from grammarserve.errors import GrammarserveError
from grammarserve.server.uploads import receive_upload

CHAT: Final = "/v1/chat/completions"


def _line(cid: str | None, content: str = "hi", url: str = CHAT) -> str:
    obj: dict[str, Any] = {"method": "POST", "url": url,
                           "body": {"model": "m", "messages": [
                               {"role": "system", "content": "shared"},
                               {"role": "user", "content": content}]}}
    if cid is not None:
        obj["custom_id"] = cid
    return json.dumps(obj)


def test_index_reports_bad_lines_with_numbers(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join([
        _line("a", "zeta"), "{not json", "", _line(None), _line("a"), "[1, 2]",
        _line("b", url="/v1/embeddings"), json.dumps({"custom_id": "c", "url": CHAT, "body": 3}),
        json.dumps({"custom_id": "d", "method": "GET", "url": CHAT, "body": {}}),
        _line("e", "alpha")]) + "\n")
    index = index_input(path)
    assert index.total == 9  # the blank line is not a request
    assert [x.custom_id for x in index.lines] == ["a", "e"]
    assert [x.custom_id for x in index.sorted_lines()] == ["e", "a"]  # grouped by prompt
    codes = {e.line: e.code for e in index.errors}
    assert codes == {2: "invalid_json", 4: "missing_custom_id", 5: "duplicate_custom_id",
                     6: "invalid_json", 7: "invalid_url", 8: "invalid_request",
                     9: "invalid_method"}
    dup = next(e for e in index.errors if e.code == "duplicate_custom_id")
    assert "line 1" in dup.message and dup.custom_id == "a"
    assert [e.code for e in index_input(path, endpoint="/v1/completions").errors].count(
        "invalid_url") == 5  # every line with a chat url is now on the wrong endpoint


def test_recover_truncates_a_torn_tail_and_resume_skips_done(tmp_path: Path) -> None:
    inp, out, err = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    inp.write_text("\n".join([_line("a"), _line("b"), "oops", _line("a"), _line("c")]) + "\n")
    index = index_input(inp)
    with ResultFile(out) as f:
        f.write([response_line("a", 200, {"ok": 1})])
    with ResultFile(err) as f:
        f.write([error_line(e) for e in index.errors])  # the bad line and the duplicate
        f.write([response_line("b", 400, {"error": {}}, line=2)])
    good = out.read_bytes()
    with open(out, "ab") as f:
        f.write(b'{"id": "batch_req_x", "custom_id": "c", "resp')  # killed mid-write
    done = scan(out, err)
    assert out.read_bytes() == good
    assert (done.completed, done.failed) == (1, 3)
    # the duplicate of "a" (line 4) does not count as answering "a"; c is left to do
    assert [x.custom_id for x in todo_lines(index, done)] == ["c"]
    out.write_bytes(good + b"garbage\n" + good)
    with pytest.raises(GrammarserveError, match="line 2"):
        recover(out)


def test_store_files_batches_pages_and_status_flow(tmp_path: Path) -> None:
    store = BatchStore(tmp_path)
    f = store.create_file("in.jsonl", "batch", b"x\n")
    assert Path(f["path"]).read_bytes() == b"x\n" and f["id"].startswith("file-")
    ids = [store.create_batch(f["id"], CHAT, "24h", {"k": str(i)})["id"] for i in range(5)]
    page, more = store.list_batches(after=None, limit=2)
    assert [b["id"] for b in page] == ids[::-1][:2] and more
    page, more = store.list_batches(after=page[-1]["id"], limit=10)
    assert [b["id"] for b in page] == ids[::-1][2:] and not more
    assert store.set_status(ids[0], "in_progress", only_from=("validating",))
    assert not store.set_status(ids[0], "in_progress", only_from=("validating",))
    assert store.set_status(ids[0], "cancelling", only_from=("validating", "in_progress"))
    out = store.batch_dir(ids[0]) / "output.jsonl"
    out.write_text("{}\n")
    assert store.register_file(out, "o.jsonl", "batch_output")["id"] == store.register_file(
        out, "o.jsonl", "batch_output")["id"]
    store.close()
    again = BatchStore(tmp_path)  # reopened: everything is still there
    row = again.get_batch(ids[0])
    assert row is not None and row["status"] == "cancelling" and row["in_progress_at"]
    assert [b["id"] for b in again.active_batches()] == ids
    assert again.delete_file(f["id"]) and not Path(f["path"]).exists()
    again.close()


def test_streamed_upload_keeps_bytes(tmp_path: Path) -> None:
    body = (b'--B\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            b'--B\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
            b'Content-Type: application/octet-stream\r\n\r\n{"a": "\xc3\xa9"}\r\n{}\n\r\n--B--\r\n')

    async def chunks() -> Any:  # split anywhere, as a chunked body may arrive
        for i in range(0, len(body), 7):
            yield body[i:i + 7]

    path = tmp_path / "up.part"
    up = asyncio.run(receive_upload(chunks(), "multipart/form-data; boundary=B", path,
                                    max_file_bytes=100))
    assert (up.fields, up.filename, up.size) == ({"purpose": "batch"}, "in.jsonl", 16)
    assert path.read_bytes() == b'{"a": "\xc3\xa9"}\r\n{}\n'


def test_routes_with_the_openai_sdk(tmp_path: Path) -> None:
    """Shapes of files and batches through the SDK (no engine: the batch stays queued)."""
    from grammarserve.config import EngineConfig
    from grammarserve.server import create_app
    from grammarserve.server.config import ServerConfig

    app = create_app(ServerConfig(engine=EngineConfig(model="/nonexistent"),
                                  data_dir=tmp_path))

    async def go() -> None:
        http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app),
                                  base_url="http://test")
        client = openai.AsyncOpenAI(base_url="http://test/v1", api_key="x", http_client=http,
                                    max_retries=0)
        data = (_line("a") + "\n").encode()
        f = await client.files.create(file=("in.jsonl", data), purpose="batch")
        assert (f.object, f.bytes, f.filename, f.purpose) == ("file", len(data), "in.jsonl",
                                                              "batch")
        assert (await client.files.retrieve(f.id)).id == f.id
        assert (await client.files.content(f.id)).content == data
        with pytest.raises(openai.BadRequestError, match="endpoint"):
            await client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                                        completion_window="24h")
        with pytest.raises(openai.BadRequestError, match="input_file_id"):
            await client.batches.create(input_file_id="file-nope", endpoint=CHAT,
                                        completion_window="24h")
        b1 = await client.batches.create(input_file_id=f.id, endpoint=CHAT,
                                         completion_window="24h", metadata={"job": "1"})
        b2 = await client.batches.create(input_file_id=f.id, endpoint=CHAT,
                                         completion_window="24h")
        assert b1.request_counts is not None
        assert (b1.status, b1.request_counts.total, b1.metadata) == ("validating", 0,
                                                                     {"job": "1"})
        page = await client.batches.list(limit=1)
        assert [b.id for b in page.data] == [b2.id] and page.has_more
        assert [b.id async for b in client.batches.list(limit=1)] == [b2.id, b1.id]
        cancelled = await client.batches.cancel(b1.id)
        assert cancelled.status == "cancelling" and cancelled.cancelling_at
        with pytest.raises(openai.NotFoundError):
            await client.batches.retrieve("batch_nope")
        deleted = await client.files.delete(f.id)
        assert deleted.deleted
        with pytest.raises(openai.NotFoundError):
            await client.files.retrieve(f.id)
        await http.aclose()

    try:
        asyncio.run(go())
    finally:
        app.state.gs.status = "failed"  # lets the idle batch worker thread end


def test_a_cursor_another_tenant_owns_is_an_unknown_id(tmp_path: Path) -> None:
    """``?after=`` with another tenant's id tells nothing (issue 33 item 5): it pages exactly
    as an id that does not exist, for files and batches."""
    store = BatchStore(tmp_path)
    mine = [store.create_file(f"a{i}.jsonl", "batch", b"x\n", tenant="alice")["id"]
            for i in range(3)]
    theirs = store.create_file("b.jsonl", "batch", b"x\n", tenant="bob")["id"]
    later = store.create_file("a3.jsonl", "batch", b"x\n", tenant="alice")["id"]
    unknown = store.list_files(purpose=None, after="file-doesnotexist", limit=10,
                               tenant="alice")
    assert store.list_files(purpose=None, after=theirs, limit=10, tenant="alice") == unknown
    assert unknown == ([], False)
    page, _ = store.list_files(purpose=None, after=later, limit=10, tenant="alice")
    assert [f["id"] for f in page] == mine[::-1]
    batch = store.create_batch(theirs, CHAT, "24h", {}, tenant="bob")["id"]
    store.create_batch(mine[0], CHAT, "24h", {}, tenant="alice")
    assert store.list_batches(after=batch, limit=10, tenant="alice") == store.list_batches(
        after="batch_doesnotexist", limit=10, tenant="alice") == ([], False)
    store.close()
