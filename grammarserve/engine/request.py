"""Per-request engine state (``Req``) and what callers get back (``RequestOutput``)."""

from __future__ import annotations

import enum
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from grammarserve.engine.detokenizer import IncrementalDetokenizer
from grammarserve.engine.radix_cache import TreeNode
from grammarserve.engine.sampler import RowRng, TopEntry
from grammarserve.errors import ErrorKind
from grammarserve.sampling_params import SamplingParams

if TYPE_CHECKING:
    from grammarserve.fsm import CompiledGrammar, Matcher
    from grammarserve.fsm.repeats import CallRepeatGuard


class ReqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestOutput:
    """A snapshot of one request: the full text so far plus what is new since the last one."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    delta_text: str
    finished: bool
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    error: str | None = None
    error_kind: ErrorKind | None = None  # set with ``error`` (the API maps it to a status)
    #: A constraint the grammar layer refused: its message and JSON path, for the API's 400
    constraint_error: tuple[str, str | None] | None = None
    logprobs: list[float] = field(default_factory=list)
    num_cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    # per output token, when params.top_logprobs > 0: the most likely allowed tokens, best first
    top_logprobs: list[list[TopEntry]] = field(default_factory=list)


@dataclass(eq=False)
class Req:
    """State of one request inside the engine.

    ``tokens`` is prompt + output; ``num_computed`` tokens of it have KV in the pool (slots listed
    in the request's table row). The next forward feeds ``tokens[num_computed:]`` (chunked).
    """

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    detok: IncrementalDetokenizer
    arrival: int
    tokens: list[int] = field(init=False)
    num_computed: int = 0
    num_allocated: int = 0  # KV slots recorded in the table row (>= num_computed)
    tree_len: int = 0  # leading slots owned by the radix cache (locked through cache_node)
    cache_node: TreeNode | None = None
    num_cached_prompt: int | None = None  # prompt tokens served from the cache at admission
    namespace: str = ""
    row: int = -1  # row in the request-to-token table while it holds KV
    status: ReqStatus = ReqStatus.WAITING
    text: str = ""
    pending_text: str = ""  # text produced since the last RequestOutput
    held_text: str = ""  # text that may start a stop string, not released yet
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[TopEntry]] = field(default_factory=list)  # params.top_logprobs > 0
    finish_reason: str | None = None
    error: str | None = None
    error_kind: ErrorKind | None = None
    constraint_error: tuple[str, str | None] | None = None
    rng: RowRng | None = None
    grammar_future: Future[CompiledGrammar] | None = None  # set while the constraint compiles
    matcher: Matcher | None = None
    num_forced: int = 0  # output tokens that came from jump-forward
    repeat_guard: CallRepeatGuard | None = None  # ends the reply at a repeated tool call
    # speculative decoding (``engine/spec``): the draft fed after the pending tokens this step
    # (checked by the matcher before the forward, which fills its bitmask rows then)
    draft: list[int] = field(default_factory=list)
    # per output token: (text produced through it, the detokenizer's mark), so a value check
    # can take tokens back (``Engine._retract``)
    marks: list[tuple[int, tuple[int, int]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tokens = list(self.prompt_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[len(self.prompt_ids):]

    @property
    def num_pending(self) -> int:
        """Tokens not yet run through the model (prompt remainder, last sample, forced span)."""
        return len(self.tokens) - self.num_computed

    @property
    def finished(self) -> bool:
        return self.status is ReqStatus.FINISHED

    def fail(self, kind: ErrorKind, message: str,
             constraint_error: tuple[str, str | None] | None = None) -> None:
        """Record the request's error (it finishes with ``finish_reason`` ``"error"``);
        ``constraint_error``: the grammar layer's message and JSON path, when it refused the
        constraint."""
        self.error, self.error_kind = message, kind
        self.constraint_error = constraint_error

    def snapshot(self) -> RequestOutput:
        delta, self.pending_text = self.pending_text, ""
        return RequestOutput(
            request_id=self.request_id, prompt_token_ids=self.prompt_ids,
            token_ids=self.output_ids, text=self.text, delta_text=delta,
            finished=self.finished, finish_reason=self.finish_reason, error=self.error,
            error_kind=self.error_kind, constraint_error=self.constraint_error,
            logprobs=list(self.logprobs), num_cached_tokens=self.num_cached_prompt or 0,
            top_logprobs=list(self.top_logprobs),
        )
