"""Server configuration (frozen, like :class:`EngineConfig`, which it wraps)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from grammarserve.config import EngineConfig
from grammarserve.errors import InvalidRequestError
from grammarserve.openai.context import model_name


@dataclass(frozen=True)
class ServerConfig:
    """Everything the HTTP server needs besides the engine's own configuration.

    Parameters
    ----------
    engine:
        The engine (model, KV budget, batch tokens, grammar backend, jump-forward).
    served_model_name:
        The ``model`` id the API reports (``/v1/models`` and replies); ``None``: the model
        folder's name (or ``SmolLM2-135M-Instruct`` for ``default``). Requests may name any
        model: there is one.
    max_n:
        Largest ``n`` (choices per request) accepted.
    max_pending_requests:
        Engine requests in flight (choices included) beyond which new requests get 503.
    startup_timeout_s:
        How long the engine may take to load before the server gives up.
    data_dir:
        Where the batch API keeps its files and SQLite state (``None``:
        ``$XDG_DATA_HOME/grammarserve``, i.e. ``~/.local/share/grammarserve``).
    """

    engine: EngineConfig = field(default_factory=EngineConfig)
    served_model_name: str | None = None
    max_n: int = 16
    max_pending_requests: int = 512
    startup_timeout_s: float = 900.0
    data_dir: Path | None = None

    def __post_init__(self) -> None:
        for name in ("max_n", "max_pending_requests"):
            if getattr(self, name) < 1:
                raise InvalidRequestError(f"{name} must be >= 1", param=name)

    def model_name(self, folder: str | None = None) -> str:
        """The ``model`` replies report (``folder``: the loaded model's folder)."""
        return model_name(self.engine, folder, self.served_model_name)
