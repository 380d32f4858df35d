"""HeapTrimmer: malloc_trim at most once per interval (simulated clock); heap_usage (glibc's
mallinfo2, in the engine's stats); freeze_startup_heap and keep_transients
(in a child process: it changes the collector of the whole process)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from grammarserve.engine.heap import HeapTrimmer, heap_usage
from grammarserve.engine.stats import heap_fields


def test_trims_at_most_once_per_interval() -> None:
    now = [100.0]
    h = HeapTrimmer(interval_s=30.0, clock=lambda: now[0])
    if h._trim is None:
        pytest.skip(f"no malloc_trim in this C library ({platform.libc_ver()})")
    assert not h.maybe_trim()  # the interval counts from construction
    now[0] += 29.9
    assert not h.maybe_trim()
    now[0] += 0.2
    assert h.maybe_trim() and h.trims == 1
    assert not h.maybe_trim()
    now[0] += 30.0
    assert h.maybe_trim() and h.trims == 2


def test_freed_memory_goes_back_to_the_os() -> None:
    h = HeapTrimmer(interval_s=0.0)
    if h._trim is None:
        pytest.skip("no malloc_trim in this C library")

    def rss_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20

    blocks = [bytearray(2000) for _ in range(100_000)]  # ~200 MB of small heap chunks
    held = rss_mb()
    keep = blocks[::1000]  # a few live chunks pin the heap's top: the arena cannot just shrink
    del blocks
    assert h.maybe_trim()
    assert rss_mb() < held - 100, (held, rss_mb())
    del keep


def test_freeze_startup_heap_takes_live_objects_out_of_collections() -> None:
    code = """
import gc
from grammarserve.engine.heap import freeze_startup_heap
alive = [[i] for i in range(50_000)]  # lists: always tracked
frozen = freeze_startup_heap()
assert frozen == gc.get_freeze_count() >= 50_000, frozen
tracked = {id(o) for o in gc.get_objects()}
assert not any(id(o) in tracked for o in alive[::1000])  # frozen: no collection walks them
later = [[j] for j in range(10)]
assert id(later[0]) in {id(o) for o in gc.get_objects()}  # new objects are still collected
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_heap_usage_reads_glibc_and_feeds_the_stats() -> None:
    usage = heap_usage()
    if usage is None:
        pytest.skip("the C library has no mallinfo2 (not glibc >= 2.33)")
    assert usage.in_use > 1 << 20  # this interpreter holds more than 1 MB of C heap
    assert usage.free_held >= 0
    blob = bytearray(64 << 20)  # an mmapped block: counted as in use while it lives
    assert heap_usage().in_use >= usage.in_use + (64 << 20) - (1 << 20)
    del blob
    assert heap_fields(usage) == {"heap_in_use_bytes": usage.in_use,
                                  "heap_free_held_bytes": usage.free_held}
    assert heap_fields(None) == {}


def test_keep_transients_reuses_freed_activation_sized_blocks() -> None:
    """After ``keep_transients`` buffers of a few MiB allocated and freed in a worker thread
    (torch's intra-op threads allocate in their own arenas) reuse the pages freed before; with
    glibc's defaults the arena gives them back and maps them again (3x the page faults here).
    In child processes: it changes the allocator of the whole process."""
    code = """
import resource, sys, threading, torch
from grammarserve.engine.heap import keep_transients
if sys.argv[1] == "keep":
    assert keep_transients()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def step():
    for n in (1, 3, 6, 2, 7):
        torch.ones(n << 18)  # 1-7 MiB, written
out = {}
def worker():
    step()
    before = faults()
    for _ in range(10):
        step()
    out["faults"] = faults() - before
t = threading.Thread(target=worker)
t.start()
t.join()
print(out["faults"])
"""
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    runs = {}
    for mode in ("keep", "default"):
        out = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        runs[mode] = int(out.stdout.strip())
    assert 2 * runs["keep"] < runs["default"], runs
