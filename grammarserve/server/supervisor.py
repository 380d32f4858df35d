"""Engine supervision: the server restarts a dead engine process, with backoff, at most so many
times in a window; one death more and it gives up, so the server exits non-zero and whatever
supervises the server (systemd, Kubernetes, a shell loop) can act. A death while a constraint
compiled (``EngineProcess.crashed_by_request``: a native crash in a grammar backend, which is
refused from then on) is restarted without spending the budget, so no client can stop the server;
those deaths have a budget of their own (``RestartPolicy.max_request_crashes``) past which each
restart waits the longest backoff, so no client can keep the engine restarting either.

# NOTE: requests in flight when the engine dies are failed at once by the engine client (503);
# nothing is replayed here. The batch worker resumes its batch from the result files once the
# new engine is up, so every batch line is still answered exactly once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from grammarserve.engine.process import EngineProcess
from grammarserve.server.config import RestartPolicy

log = logging.getLogger(__name__)


class RestartBudget:
    """The policy's arithmetic: each death asks for the delay before the next start, or None
    when the budget of the window is spent."""

    def __init__(self, policy: RestartPolicy, clock: Callable[[], float] = time.monotonic,
                 *, allowed: int | None = None) -> None:
        self.policy = policy
        self.clock = clock
        self.allowed = policy.max_restarts if allowed is None else allowed
        self._deaths: deque[float] = deque()

    def on_death(self) -> float | None:
        """Record a death; the delay before restarting, or None to give up."""
        now = self.clock()
        self._deaths.append(now)
        while self._deaths and now - self._deaths[0] > self.policy.window_s:
            self._deaths.popleft()
        k = len(self._deaths)
        if k > self.allowed:
            return None
        return float(min(self.policy.backoff_s * 2 ** (k - 1), self.policy.max_backoff_s))

    @property
    def recent(self) -> int:
        """Deaths counted in the current window."""
        return len(self._deaths)


class EngineSupervisor:
    """Watches an engine process on a thread and replaces it when it dies.

    ``start()`` builds a new engine (blocking until it is ready, or raising); ``on_down(reason)``
    is called when the engine is found dead, ``on_up(engine)`` when a replacement is ready, and
    ``on_give_up(reason)`` when the policy's budget is spent (the watcher then ends)."""

    def __init__(self, engine: EngineProcess, start: Callable[[], EngineProcess],
                 policy: RestartPolicy, *, on_down: Callable[[str], None],
                 on_up: Callable[[EngineProcess], None],
                 on_give_up: Callable[[str], None]) -> None:
        self.engine = engine
        self._start = start
        self.budget = RestartBudget(policy)
        self.request_budget = RestartBudget(policy, allowed=policy.max_request_crashes)
        self.request_deaths = 0  # deaths blamed on a request, since start
        self._on_down, self._on_up, self._on_give_up = on_down, on_up, on_give_up
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name="grammarserve-engine-supervisor")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (the caller shuts the engine down; that death is not restarted)."""
        self._stopping.set()

    def _watch(self) -> None:
        while not self._stopping.is_set():
            if not self.engine.wait_dead(timeout=1.0):
                continue
            if self._stopping.is_set():
                return
            # the client's own account (a stall kill names itself), else the exit code
            reason = self.engine.trouble() or \
                f"the engine process died (exit code {self.engine.exitcode})"
            # NOTE: a constraint that crashed a grammar backend is refused from now on (its
            # request got a 400); that death is a client's, not the engine's: not counted
            by_request = self.engine.crashed_by_request
            if by_request:
                reason += " compiling a constraint, which is refused from now on"
            if not self._replace(reason, first_delay=self._request_delay() if by_request
                                 else None):
                return

    def _request_delay(self) -> float:
        """The delay before restarting after a death blamed on a request (its own budget)."""
        self.request_deaths += 1
        delay = self.request_budget.on_death()
        if delay is None:
            log.error("%d engine deaths blamed on requests within %.0fs (more than %d): the "
                      "next restart waits %.0fs", self.request_budget.recent,
                      self.budget.policy.window_s, self.request_budget.allowed,
                      self.budget.policy.max_backoff_s)
            return self.budget.policy.max_backoff_s
        return delay

    def _replace(self, reason: str, *, first_delay: float | None = None) -> bool:
        """Restart until an engine is up (True) or the budget is spent or we stop (False);
        ``first_delay``: the first death's delay, not spending the restart budget (None: it
        spends it)."""
        while True:
            delay = self.budget.on_death() if first_delay is None else first_delay
            first_delay = None
            if delay is None:
                p = self.budget.policy
                message = (f"{reason}; giving up after {p.max_restarts} restarts within "
                           f"{p.window_s:.0f}s")
                log.error("%s", message)
                self._on_give_up(message)
                return False
            log.error("%s; restarting it in %.1fs (%d of at most %d restarts in %.0fs)",
                      reason, delay, self.budget.recent, self.budget.policy.max_restarts,
                      self.budget.policy.window_s)
            self._on_down(f"{reason}; restarting it")
            if self._stopping.wait(delay):
                return False
            try:
                engine = self._start()
            except Exception as e:  # noqa: BLE001 - a failed start is one more death
                reason = f"the engine failed to restart: {e}"
                continue
            if self._stopping.is_set():
                engine.shutdown()
                return False
            self.engine = engine
            log.warning("the engine is back (pid %s)", engine.pid)
            self._on_up(engine)
            return True
