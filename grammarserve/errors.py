"""All exceptions raised by grammarserve.

User-facing errors carry a message that says what is wrong and, where possible, how to fix it.
"""

from __future__ import annotations

import enum


class ErrorKind(str, enum.Enum):
    """What went wrong, as it crosses the engine boundary (on a finished request's output and on
    every :class:`GrammarserveError`). The protocol layer maps each kind to an HTTP status and an
    OpenAI error envelope in one table (:mod:`grammarserve.openai.errors`)."""

    INVALID_REQUEST = "invalid_request"  # a parameter is out of range or inconsistent
    PROMPT_TOO_LONG = "prompt_too_long"  # the prompt (plus max tokens) does not fit the context
    CONSTRAINT_INVALID = "constraint_invalid"  # the schema/grammar cannot be compiled or enforced
    CONSTRAINT_DEAD_END = "constraint_dead_end"  # the constraint cannot be completed by the model
    NOT_FOUND = "not_found"  # an unknown id or route
    UNAUTHORIZED = "unauthorized"  # no API key, or not one the server knows
    TOO_LARGE = "too_large"  # the request body or upload is over the server's size limit
    QUOTA_EXCEEDED = "quota_exceeded"  # an upload would take a tenant's stored files past its quota
    ENGINE_UNAVAILABLE = "engine_unavailable"  # loading, crashed or shut down
    OVERLOADED = "overloaded"  # too many requests in flight
    ENGINE_FAILURE = "engine_failure"  # a bug or an unexpected failure inside grammarserve


class GrammarserveError(Exception):
    """Base class of every error grammarserve raises on purpose; ``kind`` says what kind of
    failure it is (the HTTP status comes from it)."""

    kind: ErrorKind = ErrorKind.ENGINE_FAILURE


class ModelLoadError(GrammarserveError):
    """A model could not be found, read or understood (missing path, unknown architecture,
    corrupt or truncated weight file)."""


class UnsupportedModelError(ModelLoadError):
    """The model's architecture or one of its settings is not implemented."""


class InvalidRequestError(GrammarserveError, ValueError):
    """A request parameter is out of range or inconsistent; ``param`` names it. ``kind`` may
    narrow the failure (e.g. :attr:`ErrorKind.PROMPT_TOO_LONG`, or the kind an engine request
    failed with)."""

    kind = ErrorKind.INVALID_REQUEST

    def __init__(self, message: str, *, param: str | None = None,
                 kind: ErrorKind = ErrorKind.INVALID_REQUEST) -> None:
        super().__init__(message)
        self.param = param
        self.kind = kind


class RequestFailedError(GrammarserveError):
    """An engine request finished with an error (``finish_reason`` ``"error"``, or refused by
    the engine process): ``kind`` from the engine, ``param`` the request field at fault."""

    def __init__(self, message: str, *, kind: ErrorKind = ErrorKind.ENGINE_FAILURE,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.param = param


class OutOfMemoryError(GrammarserveError):
    """The KV pool or request table has no room for what was asked."""


class GrammarError(GrammarserveError):
    """A grammar or schema cannot be compiled or enforced; ``path`` is the JSON path of the
    offending keyword when known."""

    kind = ErrorKind.CONSTRAINT_INVALID

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class EngineDeadError(GrammarserveError):
    """The engine process stopped (crashed, was killed or shut down) while work was pending."""

    kind = ErrorKind.ENGINE_UNAVAILABLE


class SchemaValidationError(GrammarError):
    """The schema is not valid JSON, or not a valid Draft 2020-12 JSON Schema."""


class UnsupportedSchemaError(GrammarError):
    """The schema uses a keyword (``keyword``) that grammarserve cannot enforce, so it is refused
    instead of being silently dropped."""

    def __init__(self, message: str, *, path: str | None = None,
                 keyword: str | None = None) -> None:
        super().__init__(message, path=path)
        self.keyword = keyword


class StrictSchemaError(GrammarError):
    """The schema breaks OpenAI's strict-mode rules (``strict=True``)."""


class GrammarSyntaxError(GrammarError):
    """A regex, Lark or EBNF grammar does not parse; ``line``/``column`` locate the problem
    (1-based) when known."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 column: int | None = None) -> None:
        super().__init__(message, path=path)
        self.line = line
        self.column = column


class GrammarBackendError(GrammarError):
    """A grammar backend refused or failed to compile a grammar; ``backend`` names it."""

    def __init__(self, message: str, *, path: str | None = None,
                 backend: str | None = None) -> None:
        super().__init__(message, path=path)
        self.backend = backend


class GrammarTimeoutError(GrammarError):
    """Compiling a grammar took longer than the configured ``compile_timeout_s``."""
