"""Error bodies: every failure as an HTTP status and an OpenAI error envelope.

:data:`STATUS` is the one table from :class:`~grammarserve.errors.ErrorKind` to status, error
``type`` and ``code``; :func:`error_response` applies it to any exception. The HTTP server, the
``/v1/batches`` worker and the offline ``grammarserve batch`` runner all answer through it, so a
bad request gets the same status and body on every path.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grammarserve.errors import ErrorKind, GrammarserveError, InvalidRequestError
from grammarserve.openai.protocol import UNION_TAGS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ErrorStatus:
    """How one kind of failure is answered."""

    status: int
    type: str
    code: str | None = None


#: The one mapping from error kind to HTTP status and OpenAI error ``type`` / ``code``.
STATUS: dict[ErrorKind, ErrorStatus] = {
    ErrorKind.INVALID_REQUEST: ErrorStatus(400, "invalid_request_error"),
    ErrorKind.PROMPT_TOO_LONG: ErrorStatus(400, "invalid_request_error", "context_length_exceeded"),
    ErrorKind.CONSTRAINT_INVALID: ErrorStatus(400, "invalid_request_error"),
    # NOTE: a constraint "cannot be completed" when it requires text the model's tokenizer cannot
    # produce (e.g. a character whose bytes have no token): every mask is sound, yet nothing can
    # follow. The request is at fault, not the server.
    ErrorKind.CONSTRAINT_DEAD_END: ErrorStatus(400, "invalid_request_error"),
    ErrorKind.NOT_FOUND: ErrorStatus(404, "not_found_error"),
    # OpenAI answers a missing key with code null and a wrong one with "invalid_api_key"
    # (the code is then given explicitly).
    ErrorKind.UNAUTHORIZED: ErrorStatus(401, "invalid_request_error"),
    ErrorKind.TOO_LARGE: ErrorStatus(413, "invalid_request_error", "request_too_large"),
    # NOTE: 413, not 429: retrying cannot help, only deleting files can (the SDK retries 429).
    ErrorKind.QUOTA_EXCEEDED: ErrorStatus(413, "invalid_request_error", "storage_quota_exceeded"),
    ErrorKind.ENGINE_UNAVAILABLE: ErrorStatus(503, "unavailable_error", "engine_unavailable"),
    ErrorKind.OVERLOADED: ErrorStatus(503, "unavailable_error", "server_overloaded"),
    ErrorKind.ENGINE_FAILURE: ErrorStatus(500, "server_error"),
}


def error_body(message: str, *, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """The OpenAI error envelope ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def kind_response(kind: ErrorKind, message: str, param: str | None = None,
                  code: str | None = None) -> tuple[int, dict[str, Any]]:
    """``(status, body)`` of a failure of ``kind`` (``code`` overrides the table's)."""
    row = STATUS[kind]
    return row.status, error_body(message, type_=row.type, param=param, code=code or row.code)


def error_response(e: BaseException) -> tuple[int, dict[str, Any]]:
    """``(status, body)`` for any exception: a :class:`GrammarserveError` by its ``kind``
    (``param`` where it has one), anything else a 500 naming the exception type."""
    if isinstance(e, GrammarserveError):
        return kind_response(e.kind, str(e), getattr(e, "param", None))
    log.exception("unhandled error", exc_info=e)
    return kind_response(ErrorKind.ENGINE_FAILURE,
                         f"internal server error: {type(e).__name__}")


def validation_error(errors: Sequence[Any], *, loc_prefix: tuple[str, ...] = ("body",)
                     ) -> InvalidRequestError:
    """Pydantic's validation errors of a request body as one 400 naming the param
    (``messages[0].role``); ``loc_prefix`` is dropped from each location (FastAPI's
    ``"body"``, the default)."""
    errs = [dict(err) for err in errors]
    if any(err.get("type") == "json_invalid" for err in errs):
        return InvalidRequestError("the request body is not valid JSON")
    locs = [tuple(x for x in err.get("loc", ()) if x not in loc_prefix and x not in UNION_TAGS)
            for err in errs]
    common = tuple(os.path.commonprefix(locs)) if len(locs) > 1 else (locs[0] if locs else ())
    param = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in common).lstrip(".")
    msgs = list(dict.fromkeys(str(err.get("msg", "invalid value")) for err in errs))
    detail = msgs[0] if len(msgs) == 1 else "; or ".join(msgs[:4])
    return InvalidRequestError(f"{param or 'body'}: {detail}", param=param or None)
