"""The messages between the server and its engine process (pickled over one pipe).

Parent -> engine: :class:`AddRequest`, :class:`Abort`, :class:`GetStats`, :class:`Shutdown`.
Engine -> parent: :class:`Ready` or :class:`StartupFailed` once, then :class:`Outputs`,
:class:`RequestFailed`, :class:`Stats` / :class:`StatsFailed` (answers to ``GetStats``, in the
order asked), :class:`Published` (the counters, sent unasked at most every
:data:`PUBLISH_S` while the engine works, so readers never wait for a step) and
:class:`Heartbeat` (every :data:`HEARTBEAT_S`, from a thread of its own, so a stopped or
wedged engine is told from a busy one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grammarserve.engine.request import RequestOutput
from grammarserve.engine.stats import EngineStats
from grammarserve.errors import ErrorKind
from grammarserve.sampling_params import SamplingParams

#: Seconds between two heartbeats of the engine process.
HEARTBEAT_S = 1.0
#: Least seconds between two unasked publications of the engine's counters.
PUBLISH_S = 1.0


@dataclass(frozen=True)
class AddRequest:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    namespace: str = ""


@dataclass(frozen=True)
class Abort:
    request_id: str


@dataclass(frozen=True)
class GetStats:
    pass


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class Ready:
    info: dict[str, Any]


@dataclass(frozen=True)
class StartupFailed:
    message: str


@dataclass(frozen=True)
class Outputs:
    outputs: list[RequestOutput]


@dataclass(frozen=True)
class RequestFailed:
    request_id: str
    message: str
    param: str | None = None
    kind: ErrorKind = ErrorKind.INVALID_REQUEST  # ENGINE_FAILURE: an engine bug


@dataclass(frozen=True)
class Stats:
    stats: EngineStats


@dataclass(frozen=True)
class StatsFailed:
    message: str


@dataclass(frozen=True)
class Published:
    """The engine's counters after a step (not an answer to ``GetStats``)."""

    stats: EngineStats


@dataclass(frozen=True)
class Heartbeat:
    """The engine process is scheduled and its threads run.

    ``steps``: engine steps finished so far; ``in_step_s``: how long the current step has run
    (None between steps, idle included)."""

    steps: int
    in_step_s: float | None
