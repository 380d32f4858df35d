"""Whether an engine process is making progress, from what it sends (any message, and a
:class:`~grammarserve.engine.process_messages.Heartbeat` every second from a thread of its own)
and from ``/proc`` (a stopped process).

Two bounds: no message for ``stall_timeout_s`` (the process is stopped, or wedged where even
its heartbeat thread cannot run: the GIL held in native code), and one step running longer than
``step_timeout_s`` (a step that never ends while the heartbeat goes on). ``/health`` reports
trouble sooner than the kill: a stopped process at once, silence after :data:`HEALTH_SILENCE_S`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from grammarserve.engine.liveness import process_stopped
from grammarserve.engine.process_messages import Heartbeat

#: Default seconds without a heartbeat after which the engine counts as stuck.
STALL_TIMEOUT_S = 20.0
#: Default longest step (seconds) before the engine counts as stuck.
STEP_TIMEOUT_S = 600.0
#: Seconds of silence after which ``/health`` stops saying ok (a few missed heartbeats).
HEALTH_SILENCE_S = 5.0


@dataclass
class ProgressWatch:
    """What the engine client last heard from its engine, and the bounds it holds it to."""

    stall_timeout_s: float
    step_timeout_s: float
    steps: int = 0  # engine steps finished, as of the last heartbeat
    in_step_s: float | None = None  # how long the running step had run at the last heartbeat
    heard: float = field(default_factory=time.monotonic)  # when anything last arrived

    def on_message(self, msg: object) -> None:
        """Note a message from the engine (any message is a sign of life)."""
        self.heard = time.monotonic()
        if isinstance(msg, Heartbeat):
            self.steps, self.in_step_s = msg.steps, msg.in_step_s

    def overdue(self, pid: int | None) -> str | None:
        """Why the engine counts as stuck now (it is then killed), or None."""
        silent = time.monotonic() - self.heard
        if silent > self.stall_timeout_s:
            how = ("is stopped (SIGSTOP)" if process_stopped(pid)
                   else f"sent no heartbeat for {silent:.0f} s")
            return f"the engine process {how}; it was killed"
        if self.in_step_s is not None and self.in_step_s + silent > self.step_timeout_s:
            return (f"one engine step ran longer than {self.step_timeout_s:g} s; the engine "
                    "was killed")
        return None

    def trouble(self, pid: int | None) -> str | None:
        """Why ``/health`` should not say ok now (before any kill), or None."""
        if process_stopped(pid):
            return "the engine process is stopped (SIGSTOP)"
        silent = time.monotonic() - self.heard
        if silent > min(self.stall_timeout_s, HEALTH_SILENCE_S):
            return f"the engine process has sent nothing for {silent:.0f} s"
        return None
