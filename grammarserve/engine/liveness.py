"""Whether a process is dying or dead *now*, or stopped (``/health`` and the engine client's
stall watch; see DESIGN.md, "Engine process").

``multiprocessing.Process.is_alive`` (``waitpid``) says "alive" until the kernel has torn the
process down: a process killed by a signal still unmaps its memory, or writes its core dump,
for a while before it can be reaped, and ``/health`` answered 200 meanwhile (up to 0.5 s).
Linux tells sooner, in ``/proc/<pid>``: a fatal signal pending (``SIGKILL`` is queued to the
threads at once; another fatal one counts where the process does not handle it), the task
exiting (``PF_EXITING``) or dumping core (``PF_DUMPCORE``), or a
zombie. Elsewhere only ``is_alive`` is known (this answers False).
"""

from __future__ import annotations

#: Kernel task flags (``include/linux/sched.h``): exiting, dumping core, killed by a signal.
_PF_EXITING, _PF_DUMPCORE, _PF_SIGNALED = 0x4, 0x200, 0x400
#: Signals whose default action ends a process (bit n-1 of the pending masks).
_FATAL = sum(1 << (n - 1) for n in (4, 6, 7, 8, 11, 15))  # ILL ABRT BUS FPE SEGV TERM
_KILL = 1 << 8  # SIGKILL: neither caught nor ignored


def process_gone(pid: int | None) -> bool:
    """True if process ``pid`` is dead, exiting, or has a fatal signal pending (Linux
    ``/proc``); False if it runs, or nothing can be told."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read()
    except FileNotFoundError:
        return True  # reaped
    except OSError:
        return False
    fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) "
    try:
        state, flags = fields[0], int(fields[6])
    except (IndexError, ValueError):
        return False
    if state in (b"Z", b"X") or flags & (_PF_EXITING | _PF_DUMPCORE | _PF_SIGNALED):
        return True
    masks: dict[bytes, int] = {}
    for line in status.splitlines():
        key, _, value = line.partition(b":")
        if key == b"CoreDumping" and value.strip() == b"1":
            return True
        if key in (b"SigPnd", b"ShdPnd", b"SigCgt", b"SigIgn"):
            try:
                masks[key] = int(value.strip(), 16)
            except ValueError:
                return False
    pending = masks.get(b"SigPnd", 0) | masks.get(b"ShdPnd", 0)
    handled = masks.get(b"SigCgt", 0) | masks.get(b"SigIgn", 0)
    return bool(pending & _KILL or pending & _FATAL & ~handled)


def process_stopped(pid: int | None) -> bool:
    """True if process ``pid`` is stopped by a signal (``SIGSTOP``/``SIGTSTP``: state ``T``) or
    by a tracer (``t``): it makes no progress until continued. False if it runs, is gone, or
    nothing can be told."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    fields = stat[stat.rfind(b")") + 2:].split()
    return bool(fields) and fields[0] in (b"T", b"t")
