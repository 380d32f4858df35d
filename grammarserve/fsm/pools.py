"""Thread pools that end with their owner or with the interpreter: the grammar layer's background
work (upgrades and disk writes, side-by-side style compiles, value-check plans), and the
engine's mask worker and KV prefetcher, which use the same pool.

A bare ``ThreadPoolExecutor`` runs every queued item before the interpreter may exit (a script
that compiled many schemas waits for all their queued upgrades), and raises ``RuntimeError`` on
``submit`` once the interpreter began to shut down (a compile still running at exit then
reports a traceback per grammar). A :class:`BackgroundPool` is closed by its owner
(``GrammarCompiler.close()``, ``GrammarRunner.shutdown()``, ``KVTiers.close()``, all three from
``Engine.close()``) or, at the latest, when the interpreter starts shutting down,
before it joins the pools' threads: queued work is cancelled, the running item finishes, and
``submit`` answers None from then on, so the caller runs the work itself or abandons it.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundPool:
    """A thread pool whose ``submit`` returns None once it is closed (see the module)."""

    def __init__(self, workers: int, name: str,
                 initializer: Callable[..., object] | None = None,
                 initargs: tuple[Any, ...] = ()) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name,
                                        initializer=initializer, initargs=initargs)
        self._closed = False
        me = weakref.ref(self)

        def close_if_alive() -> None:
            pool = me()
            if pool is not None:
                pool.close()

        _at_interpreter_exit(close_if_alive)

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T] | None:
        """``fn(*args)`` on the pool, or None once the pool or the interpreter shuts down."""
        if self._closed:
            return None
        try:
            return self._pool.submit(fn, *args)
        except RuntimeError:  # shut down meanwhile (or the interpreter is exiting)
            return None

    def close(self, wait: bool = False) -> None:
        """Cancel the queued work and take no more; ``wait``: until the running item ends and
        the threads exit (else they exit on their own once it does). Idempotent."""
        self._closed = True
        self._pool.shutdown(wait=wait, cancel_futures=True)


def settled(value: T) -> Future[T]:
    """A future that already holds ``value`` (what a closed pool's caller answers with)."""
    done: Future[T] = Future()
    done.set_result(value)
    return done


def _at_interpreter_exit(fn: Callable[[], object]) -> None:
    # NOTE: threading's exit hooks run before the interpreter joins non-daemon threads (the
    # pools' workers; concurrent.futures registers its own join the same way, earlier, and the
    # hooks run last-registered first); atexit's run only after that join.
    register = getattr(threading, "_register_atexit", atexit.register)
    try:
        register(fn)
    except RuntimeError:  # the interpreter is already shutting down
        pass
