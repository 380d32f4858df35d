"""Server configuration (frozen, like :class:`EngineConfig`, which it wraps)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from grammarserve.batch.lines import MAX_BYTES
from grammarserve.config import EngineConfig
from grammarserve.engine.progress import STALL_TIMEOUT_S, STEP_TIMEOUT_S
from grammarserve.errors import InvalidRequestError
from grammarserve.openai.context import model_name
from grammarserve.openai.depth import DEFAULT_MAX_JSON_DEPTH


@dataclass(frozen=True)
class RestartPolicy:
    """When a dead engine is started again.

    Parameters
    ----------
    max_restarts:
        Restarts allowed within ``window_s``; the death after them ends the server (exit
        status 2). 0: never restart (exit at the first death).
    window_s:
        The sliding window ``max_restarts`` counts in.
    backoff_s:
        Delay before the first restart; doubled for each further death in the window.
    max_backoff_s:
        The longest delay.
    max_request_crashes:
        Deaths blamed on a request (a native crash while its constraint compiled; that
        constraint is refused from then on) allowed within ``window_s`` at the normal backoff.
        They do not spend ``max_restarts`` (no client can stop the server), but beyond this
        many each further one waits ``max_backoff_s`` before the restart, so a client sending
        a new crashing constraint each time cannot keep the engine restarting.
    stall_timeout_s:
        Seconds without a heartbeat from the engine (stopped, wedged) after which it counts as
        dead: its requests get 503, it is killed and restarted.
    step_timeout_s:
        The longest one engine step may run before the same.
    """

    max_restarts: int = 5
    window_s: float = 600.0
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    max_request_crashes: int = 10
    stall_timeout_s: float = STALL_TIMEOUT_S
    step_timeout_s: float = STEP_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise InvalidRequestError("engine_max_restarts must be >= 0",
                                      param="engine_max_restarts")
        if self.max_request_crashes < 0:
            raise InvalidRequestError("max_request_crashes must be >= 0",
                                      param="max_request_crashes")
        for name in ("window_s", "backoff_s", "max_backoff_s"):
            if getattr(self, name) < 0:
                raise InvalidRequestError(f"engine restart {name} must be >= 0", param=name)
        for name in ("stall_timeout_s", "step_timeout_s"):
            if getattr(self, name) <= 0:
                raise InvalidRequestError(f"engine {name} must be > 0", param=name)


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
    restart:
        When a dead engine process is restarted, and when the server gives up.
    max_body_bytes:
        Largest request body (413 beyond it, checked while the body is read); ``/v1/files``
        uploads have their own limit. 8 MiB holds a full-context prompt of the embedded model
        (at most 8192 x 81 characters, see ``max_prompt_chars``) even at 4 bytes a character.
    max_upload_bytes:
        Largest ``/v1/files`` upload (413), streamed to disk and counted while it is read
        (OpenAI's batch input limit, 200 MB).
    max_tenant_bytes:
        Bytes of files one tenant may keep under ``data_dir`` (its uploads and its batches'
        output and error files, until deleted or expired); an upload that would pass it is a
        413 naming the quota. Without API keys the whole server is one tenant.
    max_prompt_chars:
        Characters of a prompt (the text of a chat's messages and tools, or one completion
        prompt) beyond which it is refused before it is tokenized. ``None``: the context length
        times the longest token of the vocabulary in bytes, a bound no prompt that fits the
        context can exceed (see :mod:`grammarserve.openai.limits`).
    max_request_choices:
        Engine requests one API request may ask for (prompts x ``n``); more is a 400 naming the
        parameter. Capped by ``max_pending_requests`` (a request that could never be admitted
        must not get a "retry later" 503).
    max_json_depth:
        Deepest nesting of a request body's JSON (a 400 beyond it, before the body is parsed;
        see :mod:`grammarserve.openai.depth`). Schemas have their own, smaller limit
        (``EngineConfig.grammar_max_depth``).
    api_keys:
        ``key -> tenant`` (``""``: no tenant). Empty: no authentication. A tenant is the cache
        namespace of its keys' requests and owns their files and batches.
    """

    engine: EngineConfig = field(default_factory=EngineConfig)
    served_model_name: str | None = None
    max_n: int = 16
    max_pending_requests: int = 512
    startup_timeout_s: float = 900.0
    data_dir: Path | None = None
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    max_body_bytes: int = 8 * 2**20
    max_upload_bytes: int = MAX_BYTES
    max_tenant_bytes: int = 10 * 2**30
    max_prompt_chars: int | None = None
    max_request_choices: int = 128
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    api_keys: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("max_n", "max_pending_requests", "max_body_bytes", "max_upload_bytes",
                     "max_tenant_bytes", "max_request_choices", "max_json_depth"):
            if getattr(self, name) < 1:
                raise InvalidRequestError(f"{name} must be >= 1", param=name)
        if self.max_prompt_chars is not None and self.max_prompt_chars < 1:
            raise InvalidRequestError("max_prompt_chars must be >= 1", param="max_prompt_chars")

    @property
    def request_choices_limit(self) -> int:
        """Engine requests (prompts x ``n``) one API request may ask for."""
        return min(self.max_request_choices, self.max_pending_requests)

    def model_name(self, folder: str | None = None) -> str:
        """The ``model`` replies report (``folder``: the loaded model's folder)."""
        return model_name(self.engine, folder, self.served_model_name)
