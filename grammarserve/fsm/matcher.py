"""``Matcher`` (per-request grammar state) and ``CompiledGrammar`` (a reusable compiled grammar).

Matchers never raise for grammar problems: a rejected token, a backend failure or a resource
limit puts the matcher into a sticky error state (``is_error()`` / ``error()``), as llguidance
does. They raise ``ValueError`` only for API misuse (wrong bitmask shape or dtype, negative
rollback), with a message that says how to fix it.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np
import torch

from grammarserve.fsm.failures import FAILURES, Failure
from grammarserve.fsm.runs import LexTracker
from grammarserve.fsm.value_check import ValueCheck
from grammarserve.fsm.vocab import VocabInfo

log = logging.getLogger(__name__)


class SharedMasks:
    """State shared by the matchers of one compiled grammar (one backend).

    - The masks after the first few tokens, keyed by those tokens: every request whose output
      starts with the same tokens (the start itself, then e.g. ``{"`` and the first key) has
      the same mask there. A request's first masks are its most expensive ones (backends build
      their state lazily), so later requests copy them instead (~1 us). At most
      ``MAX_ENTRIES`` masks of prefixes of at most ``DEPTH`` tokens are kept.
    - The last bitmask tensor one of the matchers validated, so the others skip the checks.
    """

    DEPTH = 4
    MAX_ENTRIES = 32

    def __init__(self) -> None:
        self.masks: dict[tuple[int, ...], np.ndarray] = {}
        self.checked: tuple[torch.Tensor, np.ndarray] | None = None  # bitmask, numpy view

    def put(self, prefix: tuple[int, ...], row: np.ndarray) -> None:
        """Keep a copy of the mask ``row`` after ``prefix`` (if there is room)."""
        if len(self.masks) < self.MAX_ENTRIES:
            self.masks[prefix] = row.copy()

    @property
    def nbytes(self) -> int:
        """Memory held by the kept masks."""
        return sum(m.nbytes for m in list(self.masks.values()))


class Matcher(ABC):
    """Grammar state of one request.

    Contract for backend subclasses: implement the ``_``-prefixed hooks; they may raise any
    exception, which the public methods turn into the sticky error state. The public methods
    track termination (a stop token was accepted) and errors themselves, so both backends behave
    the same. ``runs`` are lexical bounds (whitespace, digits: ``runs.py``; the JSON style:
    ``style_track.py``) applied on top of the backend's masks and its forced tokens.
    """

    #: Whether this matcher may take back tokens it accepted (``take_retraction``): callers
    #: keep per-token text marks only for such matchers.
    retracts = False
    #: True once the matcher failed for good because its retries ran out (``checked_matcher.py``).
    exhausted = False

    def __init__(self, vocab: VocabInfo, shared: SharedMasks | None = None,
                 runs: tuple[LexTracker, ...] = ()) -> None:
        self._vocab = vocab
        self._runs = runs
        self._stops = frozenset(vocab.stop_token_ids)
        self._error: str | None = None
        self._terminated = False
        self._shared = shared if shared is not None else SharedMasks()
        self._pos = 0  # accepted tokens (a stop token counts), so 0 = the grammar's start
        self._head: list[int] = []  # the first SharedMasks.DEPTH accepted tokens
        self._checked_bitmask: torch.Tensor | None = None
        self._checked_rows = 0
        self._bitmask_np: np.ndarray | None = None  # numpy view of the checked bitmask

    @property
    def vocab(self) -> VocabInfo:
        """The vocabulary this matcher's masks are over."""
        return self._vocab

    # -- backend hooks ---------------------------------------------------------------------
    @abstractmethod
    def _accept(self, token_id: int) -> bool:
        """Advance by one token; return False if the grammar rejects it."""

    @abstractmethod
    def _fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed-token bits (stop tokens included where the grammar may end) into
        ``bitmask[row]``; ``bitmask`` is a validated contiguous CPU int32 tensor
        ``[B, vocab.bitmask_width]``."""

    @abstractmethod
    def _forced(self) -> list[int]:
        """Tokens that are the only legal continuation, safe at token boundaries."""

    @abstractmethod
    def _rollback(self, n: int) -> None:
        """Undo the last ``n`` accepted tokens (a stop token counts as one)."""

    @abstractmethod
    def _backend_error(self) -> str | None:
        """An error the backend itself reports (llguidance), else None."""

    # -- public API ------------------------------------------------------------------------
    def accept_token(self, token_id: int) -> bool:
        """Advance by ``token_id``.

        Returns
        -------
        bool
            True if accepted. False if the grammar rejects it, the matcher already terminated, or
            it is in the error state; the matcher is then (and stays) in the error state.
        """
        if self._error is not None:
            return False
        if self._terminated:
            self._error = f"token {token_id} after the grammar terminated"
            return False
        try:
            ok = self._accept(int(token_id))
        except Exception as e:  # noqa: BLE001 - backend failures become sticky state
            self._error = f"backend failure on token {token_id}: {e}"
            return False
        if not ok:
            self._error = self._backend_error() or f"token {token_id} is not allowed here"
            return False
        self._pos += 1
        for tracker in self._runs:
            tracker.advance(int(token_id))
        if len(self._head) < SharedMasks.DEPTH:
            self._head.append(int(token_id))
        if int(token_id) in self._stops:
            self._terminated = True
        return True

    def accept_draft(self, token_id: int) -> bool:
        """Advance by a draft token (speculative decoding) that this matcher's mask allows.

        As :meth:`accept_token`, except that a token which a value check or the loop guard
        would take back (a retraction) is refused instead: then nothing is accepted, the
        matcher is unchanged and not in error, and the draft ends before the token. The
        engine later accepts the tokens the model actually produced with :meth:`accept_token`,
        so retries happen only on real output. Matchers that never retract accept as usual."""
        return self.accept_token(token_id)

    def draft_mark(self) -> tuple[object, ...]:
        """State that accepting a draft and rolling it back would not restore (a wrapper's
        memo of the last forced span, the loop guard's array being closed): taken before a
        draft is checked and given back to :meth:`draft_restore` after its rollback, so the
        matcher is exactly as before. Wrappers include their inner matchers' marks."""
        return ()

    def draft_restore(self, mark: tuple[object, ...]) -> None:
        """Put back what :meth:`draft_mark` took."""

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens of this request into ``bitmask[row]`` (bit set =
        allowed). After termination or an error only the stop tokens are allowed.

        Parameters
        ----------
        bitmask : torch.Tensor
            Contiguous CPU int32 tensor ``[B, ceil(vocab_size / 32)]`` (see
            :meth:`GrammarCompiler.allocate_bitmask`); copy it to the GPU after filling.
        row : int
            The request's row.
        """
        # NOTE: the checks cost more than a cached mask; they run once per bitmask object
        # (shared by the matchers of a grammar).
        if bitmask is not self._checked_bitmask:
            self._check_bitmask(bitmask)
        if not 0 <= row < self._checked_rows:
            raise ValueError(f"row {row} is out of range for a bitmask of "
                             f"{self._checked_rows} rows")
        if self._error is None and not self._terminated:
            prefix = tuple(self._head) if self._pos <= SharedMasks.DEPTH else None
            cached = self._shared.masks.get(prefix) if prefix is not None else None
            if cached is not None and self._bitmask_np is not None:
                np.copyto(self._bitmask_np[row], cached)
                return
            try:
                self._fill(bitmask, row)
                if self._runs and self._bitmask_np is not None:
                    for tracker in self._runs:
                        tracker.apply(self._bitmask_np[row])
                err = self._backend_error()
                if err is None:
                    if prefix is not None and self._bitmask_np is not None:
                        self._shared.put(prefix, self._bitmask_np[row])
                    return
                self._error = err
            except Exception as e:  # noqa: BLE001
                self._error = f"backend failure while computing the mask: {e}"
        self._fill_stop_only(bitmask[row])

    def _check_bitmask(self, bitmask: torch.Tensor) -> None:
        checked = self._shared.checked  # NOTE: one tuple, so threads see a consistent pair
        if checked is not None and bitmask is checked[0]:
            self._checked_bitmask, self._bitmask_np = checked
            self._checked_rows = bitmask.shape[0]
            return
        if bitmask.dtype != torch.int32 or bitmask.dim() != 2:
            raise ValueError(f"bitmask must be a 2-D torch.int32 tensor, got {bitmask.dtype} with "
                             f"shape {tuple(bitmask.shape)}; use GrammarCompiler.allocate_bitmask")
        if bitmask.shape[1] != self._vocab.bitmask_width or bitmask.device.type != "cpu":
            raise ValueError(f"bitmask must be a CPU tensor of width {self._vocab.bitmask_width} "
                             f"(ceil({self._vocab.vocab_size}/32)), got shape "
                             f"{tuple(bitmask.shape)} on {bitmask.device}; fill on the CPU, "
                             "then copy to the device")
        if not bitmask.is_contiguous():
            raise ValueError("bitmask must be contiguous; use bitmask.contiguous()")
        self._checked_bitmask = bitmask
        self._checked_rows = bitmask.shape[0]
        self._bitmask_np = bitmask.numpy()
        self._shared.checked = (bitmask, self._bitmask_np)

    def forced_tokens(self) -> list[int]:
        """Jump-forward tokens: a span that is the only legal continuation, tokenized so that
        its last token is not a prefix of a longer allowed token. Accept them one by one with
        :meth:`accept_token`. Empty when nothing is forced, or after termination or an error.
        """
        if self._error is not None or self._terminated:
            return []
        try:
            forced = [t for t in self._forced() if t not in self._stops]
            for tracker in self._runs:
                forced = forced[:tracker.permits(forced)]
        except Exception as e:  # noqa: BLE001 - jump-forward is an optimization; never fail on it
            # NOTE: may repeat every token: the log is rate-limited (failures.py)
            FAILURES.report(Failure.FORCED_TOKENS, log, logging.WARNING, "%s: computing the "
                            "forced tokens failed; none are fed (the masks still hold)",
                            type(self).__name__, exc_info=e)
            return []
        # NOTE: a backend that hit a limit here (llguidance's items) stays in error; say so now
        # rather than at the next mask.
        self._error = self._backend_error()
        return forced if self._error is None else []

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` accepted tokens (up to ``max_rollback_tokens``). No-op in the
        error state (errors are sticky)."""
        if n < 0:
            raise ValueError(f"rollback needs n >= 0, got {n}")
        if n == 0 or self._error is not None:
            return
        try:
            self._rollback(n)
        except Exception as e:  # noqa: BLE001
            self._error = f"rollback({n}) failed: {e}"
            return
        for tracker in self._runs:
            tracker.rollback(n)
        self._pos = max(0, self._pos - n)
        del self._head[self._pos:]
        self._terminated = False

    def take_retraction(self) -> int:
        """How many of the last accepted tokens the caller must drop, counted since the last
        call (then reset). Non-zero only for grammars with value checks (``checked_matcher.py``): a
        token that closed a value failing its check was accepted, then rolled back with the
        tokens since the value began; the caller drops them from its output too (the token
        just accepted counts)."""
        return 0

    def held_from(self) -> int | None:
        """The first accepted token (0-based position) that a value check may still roll
        back: callers hold back the text from there (streaming). None: nothing can be."""
        return None

    def is_terminated(self) -> bool:
        """True once a stop token was accepted where the grammar may end."""
        return self._terminated

    def is_error(self) -> bool:
        """True if the matcher is in the (sticky) error state."""
        return self._error is not None

    def error(self) -> str | None:
        """The error message, or None."""
        return self._error

    def _fill_stop_only(self, target: torch.Tensor) -> None:
        target.zero_()
        for t in self._stops:
            word, bit = divmod(t, 32)
            value = int(target[word]) | (1 << bit)
            target[word] = value - (1 << 32) if value >= (1 << 31) else value


class CompiledGrammar:
    """A compiled grammar, shared by every request that uses it. Thread-safe to share;
    :meth:`matcher` creates independent per-request state.

    With ``backend="auto"`` a grammar may be *upgraded* in the background to a second backend
    that enforces the same language with faster masks (see ``policy.py``). The upgrade starts
    when the grammar is reused (its ``UPGRADE_AFTER_USES``-th matcher) or on
    :meth:`request_upgrade`; matchers created before it completes keep their backend.
    """

    #: Start the background upgrade when this many matchers have been created.
    UPGRADE_AFTER_USES = 2

    def __init__(self, *, backend: str, kind: str, make_matcher: Callable[[], Matcher],
                 size_bytes: int | Callable[[], int], compile_s: float) -> None:
        self.kind = kind
        self.compile_s = compile_s
        self.upgrade_future: Future[bool] | None = None
        self._upgrader: Callable[[], Future[bool]] | None = None
        self._uses = 0
        self._backend = backend
        self._make_matcher = make_matcher
        self._sizes: list[int | Callable[[], int]] = [size_bytes]
        # NOTE: reentrant: an upgrader whose work is already done may upgrade at once, on the
        # thread that holds the lock in request_upgrade
        self._lock = threading.RLock()

    @property
    def backend(self) -> str:
        """The backend new matchers use."""
        return self._backend

    @property
    def value_checks(self) -> tuple[ValueCheck, ...]:
        """What the grammar does not hold itself and its matchers check when the values close
        (``checked_matcher.py``); empty for most grammars."""
        return ()

    @property
    def size_bytes(self) -> int:
        """Estimated memory held now (all backends; lazily built masks make it grow)."""
        return sum(s() if callable(s) else s for s in self._sizes)

    def matcher(self) -> Matcher:
        """A fresh matcher at the start of the grammar."""
        with self._lock:
            make = self._make_matcher
            self._uses += 1
            uses = self._uses
        if uses == self.UPGRADE_AFTER_USES:
            self.request_upgrade()
        return make()

    def probe(self) -> Matcher:
        """A fresh matcher that does not count as a use (no upgrade follows from it): the
        compiler's check of the grammar's start."""
        with self._lock:
            make = self._make_matcher
        return make()

    def set_upgrader(self, upgrader: Callable[[], Future[bool]]) -> None:
        """Register how to start the upgrade (``upgrader()`` returns a future of success)."""
        with self._lock:
            self._upgrader = upgrader

    def request_upgrade(self) -> Future[bool] | None:
        """Start the planned upgrade now (once); None if no upgrade is planned. The future
        resolves to True once new matchers use the other backend, False if abandoned."""
        with self._lock:
            if self._upgrader is not None and self.upgrade_future is None:
                self.upgrade_future = self._upgrader()
            return self.upgrade_future

    def upgrade(self, other: CompiledGrammar) -> None:
        """Make new matchers come from ``other`` (same language, another backend)."""
        with self._lock:
            self._backend = other.backend
            self._make_matcher = other._make_matcher
            self._sizes.extend(other._sizes)

    def __repr__(self) -> str:
        return (f"CompiledGrammar(backend={self.backend!r}, kind={self.kind!r}, "
                f"size_bytes={self.size_bytes})")
