"""All exceptions raised by grammarserve.

User-facing errors carry a message that says what is wrong and, where possible, how to fix it.
"""

from __future__ import annotations


class GrammarserveError(Exception):
    """Base class of every error grammarserve raises on purpose."""


class ModelLoadError(GrammarserveError):
    """A model could not be found, read or understood (missing path, unknown architecture,
    corrupt or truncated weight file)."""


class UnsupportedModelError(ModelLoadError):
    """The model's architecture or one of its settings is not implemented."""


class InvalidRequestError(GrammarserveError, ValueError):
    """A request parameter is out of range or inconsistent; ``param`` names it."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class OutOfMemoryError(GrammarserveError):
    """The KV pool or request table has no room for what was asked."""


class GrammarError(GrammarserveError):
    """A grammar or schema cannot be compiled or enforced; ``path`` is the JSON path of the
    offending keyword when known."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class EngineDeadError(GrammarserveError):
    """The engine process stopped (crashed, was killed or shut down) while work was pending."""


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
