"""The OpenAI Batch API: ``/v1/files`` and ``/v1/batches`` (reference/openai-api.md §4).

Files and batches persist under the server's data dir (:mod:`grammarserve.batch.store`); a
:class:`~grammarserve.batch.worker.BatchWorker` runs the batches through the server's engine at
lower priority than interactive requests, and resumes unfinished batches after a restart.
Registered on the app with ``app.include_router(batches.router(state))``.

Uploads take OpenAI's ``expires_after`` (form fields ``expires_after[anchor]``, only
``created_at``, and ``expires_after[seconds]``, 3600 to 2592000); an expired file is 404 like an
unknown one. Each tenant's files count against ``max_tenant_bytes`` (413 past it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import FileResponse
from pydantic import Field
from starlette.exceptions import HTTPException

from grammarserve.batch.lines import ENDPOINTS
from grammarserve.batch.store import BatchStore, batch_object, default_data_dir, file_object
from grammarserve.batch.worker import BatchWorker
from grammarserve.errors import ErrorKind, InvalidRequestError
from grammarserve.openai.protocol import RequestBody
from grammarserve.server.auth import tenant_of
from grammarserve.server.limits import declared_length
from grammarserve.server.state import ServerState
from grammarserve.server.uploads import FORM_OVERHEAD, receive_upload

#: Purposes an upload may have (``batch_output`` is what the server itself produces).
PURPOSES = ("batch", "user_data", "assistants", "fine-tune", "vision", "evals")
#: Bounds of ``expires_after[seconds]`` (OpenAI's: an hour to 30 days).
EXPIRY_BOUNDS = (3600, 30 * 24 * 3600)


def _upload_doc(max_bytes: int) -> dict[str, Any]:
    """The upload's body in the OpenAPI document (the route reads the multipart body itself,
    so FastAPI cannot derive it; clients and fuzzers need it)."""
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
        "type": "object", "required": ["file", "purpose"], "properties": {
            "file": {"type": "string", "format": "binary",
                     "description": f"the file (JSONL for purpose 'batch'; at most "
                                    f"{max_bytes} bytes)"},
            "purpose": {"type": "string", "enum": list(PURPOSES)},
            "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
            "expires_after[seconds]": {"type": "integer", "minimum": EXPIRY_BOUNDS[0],
                                       "maximum": EXPIRY_BOUNDS[1]}}}}}}}


def expires_after(fields: Mapping[str, str]) -> int | None:
    """Seconds after its creation an upload expires, from its ``expires_after[anchor]`` and
    ``expires_after[seconds]`` form fields (how the OpenAI SDK sends ``expires_after``); None
    without them (the purpose's default). A 400 naming the field otherwise."""
    anchor = fields.get("expires_after[anchor]")
    seconds = fields.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise InvalidRequestError(f"expires_after.anchor must be 'created_at', got {anchor!r}",
                                  param="expires_after.anchor")
    low, high = EXPIRY_BOUNDS
    text = (seconds or "").strip()
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        raise InvalidRequestError(f"expires_after.seconds must be an integer from {low} to "
                                  f"{high}, got {seconds!r}", param="expires_after.seconds")
    return int(text)


class CreateBatchRequest(RequestBody):
    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = Field(default=None, max_length=16)


class BatchService:
    """The store and worker behind the routes, opened on first use (or at start-up when there
    may be batches to resume), so a server that never sees a batch creates no files."""

    def __init__(self, state: ServerState, clock: Callable[[], float]) -> None:
        self.state = state
        self.clock = clock
        self.explicit_dir = state.config.data_dir is not None
        self.data_dir = state.config.data_dir or default_data_dir()
        self._store: BatchStore | None = None
        self.worker: BatchWorker | None = None

    @property
    def store(self) -> BatchStore:
        if self._store is None:
            self._store = BatchStore(self.data_dir, clock=self.clock)
            rows = self.state.config.engine.max_num_reqs
            self.worker = BatchWorker(self._store, self.state, max_in_flight=max(1, rows // 2))
            self.worker.start()
        return self._store

    def start(self) -> None:
        if self.explicit_dir or (self.data_dir / "batch.sqlite3").exists():
            _ = self.store  # resume what a previous run left in progress

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
        if self._store is not None:
            self._store.close()


def router(state: ServerState, *, clock: Callable[[], float] = time.time) -> APIRouter:
    """The batch API routes, with a lifespan that starts and stops the batch worker.
    ``clock``: wall-clock seconds of the store (recorded times, file expiry)."""
    service = BatchService(state, clock)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(service.start)
        try:
            yield
        finally:
            await asyncio.to_thread(service.stop)

    r = APIRouter(lifespan=lifespan)

    # -- files --------------------------------------------------------------------------------
    max_upload = state.config.max_upload_bytes

    @r.post("/v1/files", openapi_extra=_upload_doc(max_upload))
    async def upload_file(request: Request) -> dict[str, Any]:
        size = declared_length(request.headers)
        if size is not None and size > max_upload + FORM_OVERHEAD:
            raise InvalidRequestError(f"the upload ({size} bytes) is larger than this server's "
                                      f"limit of {max_upload} bytes", param="file",
                                      kind=ErrorKind.TOO_LARGE)
        store, tenant = service.store, tenant_of(request)
        quota = await asyncio.to_thread(store.quota, tenant, state.config.max_tenant_bytes)
        file_id, tmp = store.new_upload()
        upload = await receive_upload(request.stream(), request.headers.get("content-type", ""),
                                      tmp, max_file_bytes=max_upload, quota=quota)
        try:
            purpose = upload.fields.get("purpose", "").strip()
            if purpose not in PURPOSES:
                raise InvalidRequestError(f"'purpose' must be one of {', '.join(PURPOSES)}, "
                                          f"got {purpose!r}", param="purpose")
            if not upload.has_file:
                raise InvalidRequestError("a multipart field 'file' is required", param="file")
            row = await asyncio.to_thread(store.commit_upload, file_id, tmp,
                                          upload.filename or "upload.jsonl", purpose,
                                          tenant=tenant, expires_after=expires_after(upload.fields),
                                          max_tenant_bytes=quota.limit)
        finally:
            tmp.unlink(missing_ok=True)  # gone already once committed (renamed)
        return file_object(row)

    @r.get("/v1/files")
    async def list_files(request: Request, purpose: str | None = None, after: str | None = None,
                         limit: int = Query(10000, ge=1, le=10000)) -> dict[str, Any]:
        rows, more = service.store.list_files(purpose=purpose, after=after, limit=limit,
                                              tenant=tenant_of(request))
        return _page([file_object(x) for x in rows], more)

    def _file(request: Request, file_id: str) -> dict[str, Any]:
        row = service.store.get_file(file_id, tenant=tenant_of(request))
        if row is None:
            raise HTTPException(404, f"No such File object: {file_id}")
        return row

    @r.get("/v1/files/{file_id}")
    async def get_file(request: Request, file_id: str) -> dict[str, Any]:
        return file_object(_file(request, file_id))

    @r.get("/v1/files/{file_id}/content")
    async def file_content(request: Request, file_id: str) -> FileResponse:
        path = Path(_file(request, file_id)["path"])
        if not path.exists():
            raise HTTPException(404, f"the content of {file_id} is gone")
        return FileResponse(path, media_type="application/octet-stream")

    @r.delete("/v1/files/{file_id}")
    async def delete_file(request: Request, file_id: str) -> dict[str, Any]:
        _file(request, file_id)
        await asyncio.to_thread(service.store.delete_file, file_id, tenant=tenant_of(request))
        return {"id": file_id, "object": "file", "deleted": True}

    # -- batches ------------------------------------------------------------------------------
    @r.post("/v1/batches")
    async def create_batch(req: CreateBatchRequest, request: Request) -> dict[str, Any]:
        tenant = tenant_of(request)
        if req.endpoint not in ENDPOINTS:
            raise InvalidRequestError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got "
                                      f"{req.endpoint!r}", param="endpoint")
        if req.completion_window != "24h":
            raise InvalidRequestError("completion_window must be '24h'",
                                      param="completion_window")
        row = service.store.get_file(req.input_file_id, tenant=tenant)
        if row is None:
            raise InvalidRequestError(f"input_file_id {req.input_file_id!r} does not exist",
                                      param="input_file_id")
        if row["purpose"] != "batch":
            raise InvalidRequestError(f"the input file must have purpose 'batch', not "
                                      f"{row['purpose']!r}", param="input_file_id")
        batch = await asyncio.to_thread(service.store.create_batch, req.input_file_id,
                                        req.endpoint, req.completion_window, req.metadata,
                                        tenant=tenant)
        _notify(service)
        return batch_object(batch)

    def _batch(request: Request, batch_id: str) -> dict[str, Any]:
        row = service.store.get_batch(batch_id, tenant=tenant_of(request))
        if row is None:
            raise HTTPException(404, f"No batch found with id '{batch_id}'")
        return row

    @r.get("/v1/batches/{batch_id}")
    async def get_batch(request: Request, batch_id: str) -> dict[str, Any]:
        return batch_object(_batch(request, batch_id))

    @r.get("/v1/batches")
    async def list_batches(request: Request, after: str | None = None,
                           limit: int = Query(20, ge=1, le=100)) -> dict[str, Any]:
        rows, more = service.store.list_batches(after=after, limit=limit,
                                                tenant=tenant_of(request))
        return _page([batch_object(x) for x in rows], more)

    @r.post("/v1/batches/{batch_id}/cancel")
    async def cancel_batch(request: Request, batch_id: str) -> dict[str, Any]:
        row = _batch(request, batch_id)
        if row["status"] not in ("cancelling", "cancelled"):
            moved = await asyncio.to_thread(service.store.set_status, batch_id, "cancelling",
                                            only_from=("validating", "in_progress"))
            if not moved:
                status = _batch(request, batch_id)["status"]
                raise InvalidRequestError(f"Cannot cancel a batch with status '{status}'.",
                                          param="batch_id")
            _notify(service)
        return batch_object(_batch(request, batch_id))

    return r


def _notify(service: BatchService) -> None:
    if service.worker is not None:
        service.worker.notify()


def _page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}
