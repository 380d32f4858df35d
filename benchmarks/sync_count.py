"""Host synchronisations of a stretch of CUDA work, counted with
``torch.cuda.set_sync_debug_mode("warn")``: torch warns at every synchronising call (a
``.cpu()`` / ``.item()`` / ``.tolist()`` of a device tensor, a copy from pageable memory into
a device tensor that must wait, ``torch.cuda.synchronize``); each warning is attributed to the
innermost frame of this repository on the stack (so a sync torch issues on the caller's
behalf still names the caller's line), else to the innermost frame.

On a machine without CUDA nothing is counted (:meth:`SyncCounter.active` is False).
"""

from __future__ import annotations

import traceback
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def _where(stack: list[traceback.FrameSummary]) -> str:
    """``path:line`` of the innermost repository frame (not this file), else the innermost."""
    here = Path(__file__).resolve()
    for frame in reversed(stack):
        path = Path(frame.filename).resolve()
        if path != here and path.is_relative_to(ROOT) and "site-packages" not in path.parts:
            return f"{path.relative_to(ROOT)}:{frame.lineno}"
    last = stack[-1]
    return f"{'/'.join(Path(last.filename).parts[-3:])}:{last.lineno}"


class SyncCounter:
    """Counts the syncs inside :meth:`watch` blocks, by where they were issued."""

    def __init__(self, device: torch.device) -> None:
        self.active = device.type == "cuda" and torch.cuda.is_available()
        self.by_line: Counter[str] = Counter()
        self.steps = 0  # watched blocks
        self.worst = 0  # the most syncs in one block

    @contextmanager
    def watch(self) -> Iterator[None]:
        """Run the block under sync-debug "warn" (CUDA only) and count its syncs."""
        if not self.active:
            yield
            return
        seen: Counter[str] = Counter()

        def hook(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: Any = None, line: str | None = None) -> None:
            if "synchroniz" in str(message):
                seen[_where(traceback.extract_stack()[:-1])] += 1

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = hook
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield
            finally:
                torch.cuda.set_sync_debug_mode(0)
        self.steps += 1
        self.worst = max(self.worst, sum(seen.values()))
        self.by_line.update(seen)

    def as_json(self) -> dict[str, Any] | None:
        """``{"steps", "count", "per_step_max", "by_line"}``; None without CUDA."""
        if not self.active:
            return None
        return {"steps": self.steps, "count": sum(self.by_line.values()),
                "per_step_max": self.worst, "by_line": dict(self.by_line.most_common())}
