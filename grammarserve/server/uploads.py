"""``/v1/files`` uploads: the ``multipart/form-data`` body is parsed as it arrives
(``python-multipart``) and the ``file`` part written straight to disk, counting its bytes, so a
file over the limit, or past its tenant's storage quota, is refused (413) without ever being
held in memory, chunked or not.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header

from grammarserve.batch.store import Quota
from grammarserve.errors import ErrorKind, InvalidRequestError

#: Bytes a form field other than ``file`` (``purpose``) may have.
_MAX_FIELD_BYTES = 1024
_MAX_PARTS = 8
#: Body bytes beyond the file's own (boundaries, part headers, small fields).
FORM_OVERHEAD = 64 * 1024


@dataclass
class Upload:
    """What a multipart upload held: the small fields, and the file part as written to
    ``path``."""

    path: Path
    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None
    size: int = 0
    has_file: bool = False


class _Reader:
    """python-multipart callbacks: part headers, small fields in memory, the file to disk."""

    def __init__(self, upload: Upload, out: IO[bytes], max_file_bytes: int,
                 quota: Quota | None) -> None:
        self.upload = upload
        self.out = out
        self.max_file_bytes = max_file_bytes
        self.quota = quota
        self.parts = 0
        self._header_field = bytearray()
        self._header_value = bytearray()
        self._headers: dict[bytes, bytes] = {}
        self._name: str | None = None
        self._value = bytearray()

    def callbacks(self) -> dict[str, object]:
        return {"on_part_begin": self.part_begin, "on_header_field": self.header_field,
                "on_header_value": self.header_value, "on_header_end": self.header_end,
                "on_headers_finished": self.headers_finished, "on_part_data": self.part_data,
                "on_part_end": self.part_end}

    def part_begin(self) -> None:
        self.parts += 1
        if self.parts > _MAX_PARTS:
            raise InvalidRequestError(f"the upload has more than {_MAX_PARTS} form fields",
                                      param="file")
        self._headers, self._name, self._value = {}, None, bytearray()

    def header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_field += data[start:end]

    def header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def header_end(self) -> None:
        self._headers[bytes(self._header_field).lower()] = bytes(self._header_value)
        self._header_field, self._header_value = bytearray(), bytearray()

    def headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition"))
        name = options.get(b"name")
        self._name = name.decode("utf-8", "replace") if name is not None else None
        if self._name == "file":
            if self.upload.has_file:
                raise InvalidRequestError("the upload has two 'file' fields", param="file")
            self.upload.has_file = True
            filename = options.get(b"filename")
            self.upload.filename = filename.decode("utf-8", "replace") if filename else None

    def part_data(self, data: bytes, start: int, end: int) -> None:
        if self._name == "file":
            self.upload.size += end - start
            if self.upload.size > self.max_file_bytes:
                raise InvalidRequestError(
                    f"the file is larger than this server's limit of {self.max_file_bytes} "
                    "bytes", param="file", kind=ErrorKind.TOO_LARGE)
            if self.quota is not None:
                self.quota.check(self.upload.size, partial=True)
            self.out.write(data[start:end])
        else:
            self._value += data[start:end]
            if len(self._value) > _MAX_FIELD_BYTES:
                raise InvalidRequestError(f"form field {self._name!r} is longer than "
                                          f"{_MAX_FIELD_BYTES} bytes", param=self._name)

    def part_end(self) -> None:
        if self._name is not None and self._name != "file":
            self.upload.fields[self._name] = self._value.decode("utf-8", "replace")


def boundary_of(content_type: str) -> bytes:
    """The multipart boundary of a ``multipart/form-data`` content type (400 otherwise)."""
    ctype, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if ctype != b"multipart/form-data" or not boundary:
        raise InvalidRequestError("POST /v1/files takes multipart/form-data (fields 'file' "
                                  "and 'purpose')", param="file")
    return boundary


async def receive_upload(chunks: AsyncIterator[bytes], content_type: str, path: Path, *,
                         max_file_bytes: int, quota: Quota | None = None) -> Upload:
    """Parse a multipart body from ``chunks``, writing its ``file`` part to ``path``.

    Raises :class:`InvalidRequestError` (413 kinds when the file is over ``max_file_bytes``
    or would pass ``quota``); ``path`` is removed when it raises."""
    upload = Upload(path)
    parser_boundary = boundary_of(content_type)
    out: IO[bytes] = await asyncio.to_thread(open, path, "wb")
    try:
        reader = _Reader(upload, out, max_file_bytes, quota)
        parser = MultipartParser(parser_boundary, reader.callbacks())  # type: ignore[arg-type]
        total = 0
        async for chunk in chunks:
            total += len(chunk)
            if total > max_file_bytes + FORM_OVERHEAD:
                raise InvalidRequestError(
                    f"the upload is larger than this server's limit of {max_file_bytes} bytes",
                    param="file", kind=ErrorKind.TOO_LARGE)
            if chunk:  # file writes happen in the callbacks: off the event loop
                await asyncio.to_thread(parser.write, chunk)
        if parser.state != MultipartState.END:
            raise InvalidRequestError("the multipart body ended before its closing boundary",
                                      param="file")
    except MultipartParseError as e:
        path.unlink(missing_ok=True)
        raise InvalidRequestError(f"the multipart body could not be read: {e}",
                                  param="file") from None
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    finally:
        out.close()
    return upload
