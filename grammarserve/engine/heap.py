"""Keep the engine process's heap from stalling or growing: freeze what start-up built out of
the garbage collector's reach, and give freed heap memory back to the OS now and then.

After the engine is built (torch, transformers and the tokenizer: ~360,000 tracked objects), a
full collection of CPython's oldest generation takes ~160 ms (AMD EPYC, the embedded model),
a stall of every request in the batch whenever it runs; :func:`freeze_startup_heap` moves those
objects to the permanent generation (``gc.freeze``), after which a full collection takes ~0 ms.
vLLM does the same after its warm-up (``freeze_gc_heap``), SGLang offers it (``freeze_gc``).
It is for processes that exist to run an engine (the server's engine process, ``grammarserve
batch``, a Ray batch actor), not for the library API, which lives in the caller's process.

Requests, grammar matchers and their masks allocate and free many small native and Python
objects; glibc keeps freed chunks in its arenas, so the engine's resident memory only grows under
steady traffic (a 10-minute soak: +113 MB, of which ``malloc_trim`` returned most in an in-process
check: 2282 -> 2204 MB after ~500 requests). :class:`HeapTrimmer` calls ``malloc_trim(0)`` at most
once per interval; elsewhere than glibc it does nothing. :func:`heap_usage` reads glibc's
``mallinfo2``: what the program holds and what the allocator keeps free without returning it
(a free share that grows under steady traffic is fragmentation, not a leak).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass


#: glibc's mallopt parameters (malloc.h) and what :func:`keep_transients` sets them to.
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -2, -3, -4
_MMAP_THRESHOLD = 32 << 20  # glibc's largest (blocks above it are mapped unless mapping is off)
_TRIM_THRESHOLD = 1 << 30
_TOP_PAD = 64 << 20


def freeze_startup_heap() -> int:
    """Collect once, then exclude every object alive now from future collections; returns how
    many objects were frozen. Call it once, when the engine is built and before traffic. Also
    :func:`keep_transients` (the same processes: those that exist to run an engine)."""
    gc.collect()
    gc.freeze()
    keep_transients()
    return gc.get_freeze_count()


def keep_transients() -> bool:
    """Let glibc reuse a forward's freed buffers instead of mapping fresh pages for each: every
    block comes from the heap (no ``mmap`` per block: a prefill's 64-128 MiB activations were
    mapped and unmapped per op) and up to 1 GiB of free memory stays in an arena between
    :class:`HeapTrimmer`'s trims (by default an arena gives back what passes glibc's dynamic
    trim threshold, and the worker threads' arenas, where oneDNN's GEMM scratch lives, shrink
    and grow again on every call). A prefill forward allocates hundreds of multi-MiB
    temporaries, and each fresh page costs a fault: a 2,664-token prompt at the 1.7B shape took
    14.8 s (13.3 s) to its first token with glibc's defaults, 11.1 s (10.2 s) with the
    thresholds alone, and a 2,680-token one behind two others 10.0 s with mapping off too
    (Intel Xeon with AMX, 2 threads, in-process). Call it once the model is loaded (its load
    maps and frees large blocks). Returns False where there is no ``mallopt`` (not glibc)."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    for param, value in ((_M_MMAP_THRESHOLD, _MMAP_THRESHOLD), (_M_MMAP_MAX, 0),
                         (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD), (_M_TOP_PAD, _TOP_PAD)):
        mallopt(param, value)
    return True


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, opened once (``heap_usage`` runs with every stats snapshot)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def trim_heap() -> None:
    """Return the C heap's free memory to the OS now (``malloc_trim``; a no-op without it): after
    loading a model, whose transient copies the allocator would otherwise keep resident and the
    memory plan would count as used."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


@dataclass(frozen=True)
class HeapUsage:
    """The C heap of this process (bytes): held by the program (heap chunks and mmapped
    blocks), and free inside the allocator's arenas (resident until trimmed or reused)."""

    in_use: int
    free_held: int


def heap_usage() -> HeapUsage | None:
    """glibc's ``mallinfo2`` now (all arenas); None where it is missing (musl, macOS, glibc
    before 2.33). Costs a walk of every arena's bins: call it at most about once a second."""
    libc = _libc()
    fn = getattr(libc, "mallinfo2", None) if libc is not None else None
    if fn is None:
        return None
    fn.restype = _MallInfo2
    info = fn()
    return HeapUsage(in_use=int(info.uordblks + info.hblkhd), free_held=int(info.fordblks))


class HeapTrimmer:
    """``maybe_trim()`` returns freed heap memory to the OS if ``interval_s`` has passed since the
    last time (glibc's ``malloc_trim``; a no-op where it is missing)."""

    def __init__(self, interval_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last = clock()
        self.trims = 0
        libc = _libc()
        self._trim: Callable[[int], int] | None = getattr(libc, "malloc_trim", None)

    def maybe_trim(self) -> bool:
        """Trim if the interval has passed; True when it did."""
        now = self._clock()
        if self._trim is None or now - self._last < self.interval_s:
            return False
        self._last = now
        self._trim(0)
        self.trims += 1
        return True
