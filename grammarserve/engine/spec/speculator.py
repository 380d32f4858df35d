"""Speculative decoding in the engine's step.

Before a step, each decoding request may get a draft (``propose``): the tokens that followed
the longest n-gram (2..4 tokens) ending its sequence, found in its own prompt and reply
(prompt lookup) or in an earlier reply of its namespace (``replies.py``), the longer match
winning. A constrained request's draft is checked by its matcher before the forward (the
engine's grammar runner: it stops at the first token the mask refuses, or that a value check
or the loop guard would take back) and the masks of its positions are filled then. The draft
rides in the step's one forward after the request's pending tokens; the forward returns the
logits of each draft position and of the one after it.

Verification (``verify``) samples every position exactly as a plain step would (same masks,
penalties, history and random draw: draw ``offset + j`` for position ``j``), then walks them:
the sample at position ``j`` is the request's next token, appended by the engine's usual path
(matcher, value checks, jump-forward, stop conditions); while the token appended is the
draft's own (and nothing else was appended: a jump-forward span ends the walk, its tokens' KV
kept where they match the draft), the next position's logits are the ones a plain step would
have computed, so the walk goes on; at the first difference it stops, and the KV of the
positions not taken is freed. Each token is thus drawn from the distribution a plain step would draw it from (for a
deterministic draft this is exact rejection sampling; greedy output is the same tokens), and a
draft never reaches the output unless the model chose it.

Where the grammar forces the next tokens but jump-forward does not feed them (a JSON schema's
key names, by default: the model spells them itself), the draft starts with them, in the
tokenizer's own tokenization.

How much to draft (``adaptive``): per request, the acceptance of its recent drafts against
the measured cost of one more token fed (``cost.py``: ``StepCost``); per batch size, whether
steps with drafts yield output tokens faster than steps without, measured on both
(``SpecSwitch``): at large batches, where a step is compute-bound, drafts stop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import overload

from grammarserve.engine.request import Req, ReqStatus
from grammarserve.engine.sampler import History, RowRng, SampleOutput, TopEntry
from grammarserve.engine.spec.cost import SpecSwitch, StepCost, draft_length
from grammarserve.engine.spec.ngram import Match, NgramIndex
from grammarserve.engine.spec.replies import CONTEXT, ReplyStore
from grammarserve.sampling_params import SamplingParams

PRIOR_ACCEPTED = 1.5  # a new request's drafts: as if 1.5 of 2.5 draft tokens were taken
PRIOR_REJECTED = 1.0
DECAY = 0.8  # per verified draft
MAX_PENDING = 32  # pending + draft tokens of one request in one step

#: The engine's path for one sampled token: (request, token, logprob, no token allowed, top)
Advance = Callable[[Req, int, float, bool, list[TopEntry]], None]


@dataclass(frozen=True)
class SpecOptions:
    """``max_draft``: draft tokens per request and step at most (0: off); ``adaptive``: draft
    only as much as the measured costs say pays (else ``max_draft`` whenever a match exists);
    ``reply_tokens`` / ``namespaces``: the earlier replies kept per namespace, and how many
    namespaces keep theirs."""

    max_draft: int = 8
    adaptive: bool = True
    reply_tokens: int = 32768
    namespaces: int = 64


@dataclass
class SpecCounters:
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    verified_drafts: int = 0


@dataclass
class _State:
    """A request's n-gram index and the acceptance of its drafts: overall, and after each
    last token drafted from (a value's opening quote drafts badly, a key's colon well)."""

    index: NgramIndex = field(default_factory=NgramIndex)
    accepted: float = PRIOR_ACCEPTED
    rejected: float = PRIOR_REJECTED
    after: dict[int, tuple[float, float]] = field(default_factory=dict)
    key: int = -1  # the last token of the sequence the pending draft was made after

    @property
    def alpha(self) -> float:
        """Estimated chance that a draft token is taken, given the one before it was."""
        return self.accepted / (self.accepted + self.rejected)

    def alpha_after(self, token: int) -> float:
        """As :attr:`alpha`, for drafts made after ``token`` (the overall figure counts as
        one draft of evidence)."""
        acc, rej = self.after.get(token, (0.0, 0.0))
        a = self.alpha
        return (acc + a) / (acc + rej + 1.0)

    def record(self, taken: int, drafted: int) -> None:
        missed = float(taken < drafted)
        self.accepted = self.accepted * DECAY + taken
        self.rejected = self.rejected * DECAY + missed
        acc, rej = self.after.get(self.key, (0.0, 0.0))
        self.after[self.key] = (acc * DECAY + taken, rej * DECAY + missed)


@dataclass(frozen=True)
class SampleRows:
    """The step's sampling rows: each request's first row, then one row per draft token."""

    params: list[SamplingParams]
    rngs: list[RowRng | None]
    history: list[History]
    first: list[int]


class _Prefix(Sequence[int]):
    """The first ``n`` tokens of ``seq`` (no copy): the history of a draft position."""

    def __init__(self, seq: list[int], n: int) -> None:
        self._seq, self._n = seq, n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...

    def __getitem__(self, i: int | slice) -> int | list[int]:
        if isinstance(i, slice):
            return self._seq[slice(*i.indices(self._n))]
        if not -self._n <= i < self._n:
            raise IndexError(i)
        return self._seq[i % self._n]


def attention_work(reqs: list[Req]) -> float:
    """The attention of a step feeding ``reqs``' pending tokens: queries times keys, in
    thousands."""
    return sum(r.num_pending * (r.num_computed + r.num_pending / 2) for r in reqs) / 1000


class Speculator:
    """Drafts, sampling rows and verification for one engine (see the module docstring)."""

    def __init__(self, options: SpecOptions, *, max_model_len: int,
                 generated: Callable[[], int], fold: Sequence[int] | None = None) -> None:
        """``generated``: the engine's count of sampled output tokens so far (what a step
        yields; jump-forward spans left out: they come as fast with drafts as without, and a
        step that happens to unlock one would otherwise look several times cheaper);
        ``fold``: the tokenizer's ``ngram.space_folded`` ids, for prompt lookup."""
        self._fold = fold
        self.options = options
        self.max_model_len = max_model_len
        self._generated = generated
        self._drafting = False  # whether this step feeds any draft
        self._started = 0.0  # when this step's propose began
        self._before = 0  # output tokens before this step
        self.cost = StepCost()
        self.switch = SpecSwitch()
        self.counters = SpecCounters()
        self._replies = ReplyStore(options.namespaces, options.reply_tokens)
        self._states: dict[str, _State] = {}

    # -- before the step -------------------------------------------------------------------
    def propose(self, running: list[Req], forced: Callable[[Req], list[int]]) -> None:
        """Set ``req.draft`` for each running request that decodes (empty where nothing
        matches or drafting would not pay): the span its grammar forces next (``forced``),
        then the n-gram match's continuation."""
        self._started = time.perf_counter()  # NOTE: the step's cost includes the drafting
        self._before = self._generated()
        if self.options.max_draft <= 0:
            return
        decoding = [r for r in running if self._decodes(r)]
        self._drafting = False
        for r in running:
            r.draft = []
        if not decoding:
            return
        adaptive = self.options.adaptive
        if adaptive and not self.switch.enabled(len(decoding)):
            return
        fit = self.cost.fit()
        value = 0.0
        if fit is not None:  # NOTE: the time one accepted token saves, per row
            value = fit.step(sum(r.num_pending for r in decoding),
                             attention_work(decoding)) / len(decoding)
        for req in decoding:
            state = self._states.get(req.request_id)
            if state is None:
                state = self._states[req.request_id] = _State(NgramIndex(self._fold))
            cap = min(self.options.max_draft, MAX_PENDING - req.num_pending,
                      req.params.max_tokens - len(req.output_ids) - 1,
                      self.max_model_len - len(req.tokens) - 1)
            if adaptive and fit is not None:
                cap = draft_length(state.alpha_after(req.tokens[-1]), value,
                                   fit.marginal(len(req.tokens)), cap)
            if cap <= 0:
                continue
            head = forced(req)[:cap] if req.matcher is not None else []
            seq = req.tokens + head if head else req.tokens
            match = self._match(req, state, seq) if len(head) < cap else None
            rest = list(match.source[match.start:match.start + cap - len(head)]) \
                if match is not None else []
            req.draft = head + rest
            state.key = req.tokens[-1]
            self._drafting = self._drafting or bool(req.draft)

    @staticmethod
    def _decodes(req: Req) -> bool:
        return (req.status is ReqStatus.RUNNING and req.finish_reason is None
                and req.error is None and req.num_computed >= len(req.prompt_ids)
                and req.num_pending >= 1)

    def _match(self, req: Req, state: _State, seq: list[int]) -> Match | None:
        """The longer of the n-gram matches for ``seq`` (``req``'s tokens, perhaps with a
        forced span after them) in its own tokens and in its namespace's earlier replies."""
        state.index.update(req.tokens)
        own = state.index.match(seq, source=req.tokens)
        replies = self._replies.get(req.namespace)
        other = replies.match(seq) if replies is not None else None
        if other is not None and (own is None or other.n > own.n):
            return other
        return own

    def rows(self, reqs: list[Req]) -> SampleRows:
        """One sampling row per request, plus one per draft token after it."""
        params: list[SamplingParams] = []
        rngs: list[RowRng | None] = []
        history: list[History] = []
        first: list[int] = []
        for req in reqs:
            first.append(len(params))
            n = 1 + len(req.draft)
            params += [req.params] * n
            rngs += [req.rng] * n  # NOTE: sample() draws offset, offset + 1, ... in row order
            plen = len(req.prompt_ids)
            if n == 1:
                history.append(History(req.tokens, plen))
                continue
            fed = req.tokens + req.draft
            history += [History(_Prefix(fed, len(req.tokens) + j), plen) for j in range(n)]
        return SampleRows(params, rngs, history, first)

    @contextmanager
    def timed(self, work: list[tuple[int, int]]) -> Iterator[None]:
        """Time a step for the cost fit and the switch, from its :meth:`propose` (drafting
        and checking drafts cost time too): ``work`` is each request's (tokens fed, position
        of the first) when every request in it decodes (empty: a step with prefill, not
        recorded)."""
        yield
        if work:
            seconds = time.perf_counter() - self._started
            attention = sum(n * (p + n / 2) for n, p in work) / 1000
            self.cost.observe(sum(n for n, _ in work), attention, seconds)
            self.switch.record(len(work), self._drafting, seconds,
                               self._generated() - self._before)

    # -- after the forward -----------------------------------------------------------------
    def verify(self, req: Req, first: int, out: SampleOutput, advance: Advance) -> None:
        """Walk ``req``'s sampled rows from ``first`` (see the module docstring); sets
        ``req.num_computed`` to the positions whose KV stays valid (the engine frees the rest
        with the scheduler's rewind)."""
        draft, req.draft = req.draft, []
        base = len(req.tokens)
        offset = req.rng.offset - len(draft) - 1 if req.rng is not None else 0
        j = 0
        while True:
            req.num_computed = base + j
            i = first + j
            advance(req, out.token_ids[i], out.logprobs[i], out.no_allowed[i], out.top[i])
            # NOTE: a forced span (or a retraction) ends the walk even where it matches the
            # draft: its KV is kept, but the next sample must take the next draw, as plain
            # decoding would (forced tokens draw nothing), so seeded output stays the same
            if (req.finish_reason is not None or len(req.tokens) != base + j + 1
                    or j >= len(draft) or req.tokens[-1] != draft[j]):
                break
            j += 1
        if req.rng is not None:
            req.rng.offset = offset + j + 1  # NOTE: one draw per row walked
        taken = 0
        for a, b in zip(req.tokens[base:], draft):
            if a != b:
                break
            taken += 1
        if req.finish_reason is None and req.status is ReqStatus.RUNNING:
            req.num_computed = max(req.num_computed,
                                   min(base + taken, len(req.tokens) - 1, req.num_allocated))
        state = self._states.get(req.request_id)
        if draft and state is not None:
            c = self.counters
            c.drafted_tokens += len(draft)
            c.accepted_tokens += taken
            c.verified_drafts += 1
            state.record(taken, len(draft))

    def finish(self, req: Req) -> None:
        """Forget a finished request; a reply that ended normally joins its namespace's."""
        self._states.pop(req.request_id, None)
        if req.finish_reason == "stop" and req.output_ids and self.options.max_draft > 0:
            self._replies.add(req.namespace, req.prompt_ids[-CONTEXT:] + req.output_ids)
