"""Compiled-grammar cache: in-flight dedupe, byte bound, timeouts, error delivery (no
tokenizer needed: compiles are fakes)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from waiting import wait_until

from grammarserve.errors import GrammarError, GrammarTimeoutError
from grammarserve.fsm import CompiledGrammar
from grammarserve.fsm.cache import GrammarCache
from grammarserve.fsm.deadlines import Deadline, current
from grammarserve.fsm.limits import GrammarLimits


def fake(size: int = 100) -> CompiledGrammar:
    return CompiledGrammar(backend="fake", kind="regex", make_matcher=lambda: None,  # type: ignore[arg-type, return-value]
                           size_bytes=size, compile_s=0.0)


def test_concurrent_identical_compiles_share_one() -> None:
    cache = GrammarCache(max_bytes=10_000, timeout_s=5, threads=2)
    calls = []
    gate = threading.Event()

    def compile_fn() -> CompiledGrammar:
        calls.append(1)
        gate.wait(2)
        return fake()

    results: list[Any] = []
    threads = [threading.Thread(target=lambda: results.append(
        cache.get_or_compile("k", compile_fn).result())) for _ in range(2)]
    for t in threads:
        t.start()
    # the second caller has joined the first's compile, which is still running
    wait_until(lambda: len(calls) == 1 and cache.stats().shared == 1, 10,
               "the second caller sharing the running compile")
    gate.set()
    for t in threads:
        t.join()
    assert len(calls) == 1 and results[0] is results[1]
    stats = cache.stats()
    assert stats.misses == 1 and stats.shared + stats.hits == 1
    assert cache.get_or_compile("k", compile_fn).result() is results[0]
    assert cache.stats().hits >= 1 and len(calls) == 1


def test_cache_stays_under_byte_bound() -> None:
    cache = GrammarCache(max_bytes=1_000, timeout_s=5, threads=2)
    for i in range(20):
        cache.get_or_compile(f"k{i}", lambda: fake(300)).result()
        assert cache.stats().bytes <= 1_000
    stats = cache.stats()
    assert stats.entries == 3 and stats.evictions == 17
    cache.get_or_compile("big", lambda: fake(5_000)).result()  # larger than the bound
    assert cache.stats().bytes <= 1_000


def test_lru_keeps_recently_used() -> None:
    cache = GrammarCache(max_bytes=300, timeout_s=5, threads=1)
    first = cache.get_or_compile("a", lambda: fake(100)).result()
    cache.get_or_compile("b", lambda: fake(100)).result()
    cache.get_or_compile("a", lambda: fake(100)).result()  # touch a
    cache.get_or_compile("c", lambda: fake(100)).result()
    cache.get_or_compile("d", lambda: fake(100)).result()  # evicts b
    assert cache.get_or_compile("a", lambda: fake(100)).result() is first
    assert cache.stats().entries == 3


def test_timeout_is_an_error_and_does_not_block_others() -> None:
    cache = GrammarCache(max_bytes=10_000, timeout_s=0.3, threads=1)
    release, slow_returned = threading.Event(), threading.Event()

    def slow() -> CompiledGrammar:
        release.wait(30)
        slow_returned.set()
        return fake()

    start = time.perf_counter()
    with pytest.raises(GrammarTimeoutError, match="timeout"):
        cache.get_or_compile("slow", slow).result()
    assert time.perf_counter() - start < 10  # the 0.3 s timeout, not the 30 s compile
    # The only slot was given back: a new compile finishes while the slow one still runs.
    # NOTE: proven by the event, not by a wall-clock bound a loaded machine could break.
    assert cache.get_or_compile("fast", fake).result() is not None
    assert not slow_returned.is_set()
    assert cache.stats().timeouts == 1
    release.set()


def test_compile_errors_reach_every_waiter_and_are_remembered() -> None:
    """A refusal is remembered (issue 20's negative cache): the same key is refused again
    without compiling; an unexpected failure too, for the TTL only; with
    ``negative_entries=0`` nothing is remembered."""
    cache = GrammarCache(max_bytes=10_000, timeout_s=5, threads=2)
    calls = []

    def bad() -> CompiledGrammar:
        calls.append("bad")
        raise GrammarError("nope", path="$.x")

    for _ in range(2):
        with pytest.raises(GrammarError, match="nope") as err:
            cache.get_or_compile("bad", bad).result()
        assert err.value.path == "$.x"
    assert calls == ["bad"]

    def crash() -> CompiledGrammar:
        raise RuntimeError("backend bug")

    with pytest.raises(GrammarError, match="backend bug"):
        cache.get_or_compile("crash", crash).result()
    stats = cache.stats()
    assert (stats.errors, stats.refused, stats.refused_entries, stats.entries) == (2, 1, 2, 0)

    forgetful = GrammarCache(max_bytes=10_000, timeout_s=5, threads=1,
                             limits=GrammarLimits(negative_entries=0))
    for _ in range(2):
        with pytest.raises(GrammarError, match="nope"):
            forgetful.get_or_compile("bad", bad).result()
    assert calls == ["bad"] * 3 and forgetful.stats().refused_entries == 0


@pytest.mark.model
def test_real_compiler_dedupes_threads_and_counts() -> None:
    from transformers import AutoTokenizer

    from grammarserve.fsm import GrammarCompiler
    from grammarserve.models.loader import resolve_model_folder

    tok = AutoTokenizer.from_pretrained(str(resolve_model_folder("default")))
    compiler = GrammarCompiler(tok, backend="llguidance")
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    barrier = threading.Barrier(2)
    out: list[CompiledGrammar] = []

    def run() -> None:
        barrier.wait()
        out.append(compiler.compile_json_schema(schema))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out[0] is out[1]
    stats = compiler.cache_stats()
    assert stats.misses == 1 and stats.shared + stats.hits == 1 and stats.compile_s_total > 0
    # Same schema text with different whitespace hits; different key order does not.
    assert compiler.compile_json_schema(' {"type":"object","properties":{"x":{"type":'
                                        '"integer"}}}') is out[0]


@pytest.mark.model
def test_clear_caches_makes_the_next_compile_cold(tokenizer: Any) -> None:
    """``clear_caches`` forgets compiled grammars and front-end results (bench_grammar.py's
    cold figures); ``background_upgrade=False`` keeps a reused grammar on its first backend."""
    from grammarserve.fsm import GrammarCompiler

    compiler = GrammarCompiler(tokenizer, background_upgrade=False)
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    first = compiler.compile_json_schema(schema)
    assert compiler.compile_json_schema(schema) is first
    compiler.clear_caches()
    again = compiler.compile_json_schema(schema)
    assert again is not first and compiler.cache_stats().misses == 2
    for _ in range(3):
        again.matcher()
    assert again.request_upgrade() is None and again.backend == first.backend == "llguidance"


def _growing(size: list[int], calls: list[int]) -> CompiledGrammar:
    def size_bytes() -> int:
        calls.append(1)
        return size[0]
    return CompiledGrammar(backend="fake", kind="regex", make_matcher=lambda: None,  # type: ignore[arg-type, return-value]
                           size_bytes=size_bytes, compile_s=0.0)


def test_an_insert_does_not_size_every_cached_grammar_again() -> None:
    cache = GrammarCache(max_bytes=10**9, timeout_s=5, threads=1)
    calls: list[int] = []
    for i in range(60):
        cache.get_or_compile(f"k{i}", lambda: _growing([10], calls)).result()
    assert len(calls) < 4 * 60  # all of them each time would be ~60 * 61 / 2


def test_growth_after_insertion_counts_at_the_next_full_resize(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from grammarserve.fsm import cache as cache_module

    monkeypatch.setattr(cache_module, "_RESIZE_S", 0.0)  # every insert recomputes in full
    size: list[int] = [100]
    calls: list[int] = []
    cache = GrammarCache(max_bytes=1_000, timeout_s=5, threads=1)
    cache.get_or_compile("a", lambda: _growing(size, calls)).result()
    size[0] = 950  # e.g. lazily built masks, a background upgrade
    cache.get_or_compile("b", lambda: fake(100)).result()
    stats = cache.stats()
    assert stats.entries == 1 and stats.evictions == 1 and stats.bytes == 100


def test_a_compile_every_waiter_left_never_starts() -> None:
    cache = GrammarCache(max_bytes=10_000, timeout_s=30, threads=1)
    gate, running = threading.Event(), threading.Event()
    ran: list[int] = []

    def slow() -> CompiledGrammar:
        running.set()
        gate.wait(10)
        return fake()

    cache.get_or_compile("slow", slow)
    assert running.wait(10)
    def never() -> CompiledGrammar:
        ran.append(1)
        return fake()

    first = cache.get_or_compile("queued", never)
    second = cache.get_or_compile("queued", never)
    assert first is second
    cache.abandon(first)
    assert not first.done()  # one request still waits
    cache.abandon(second)
    with pytest.raises(GrammarError, match="abandoned"):
        first.result(0)
    gate.set()
    again = cache.get_or_compile("queued", fake)  # a new request: a new compile, not refused
    assert isinstance(again.result(10), CompiledGrammar) and ran == []
    cache.close()


def test_an_abandoned_running_compile_is_told_to_stop_and_not_remembered() -> None:
    cache = GrammarCache(max_bytes=10_000, timeout_s=30, threads=1)
    started, gate = threading.Event(), threading.Event()
    seen: list[Deadline] = []

    def stoppable() -> CompiledGrammar:
        seen.append(current(60))  # what llguidance's probe reads
        started.set()
        gate.wait(10)
        raise GrammarTimeoutError("stopped at its deadline")

    future = cache.get_or_compile("k", stoppable)
    assert started.wait(10) and seen[0].left() > 20
    cache.abandon(future)
    assert seen[0].left() == 0
    with pytest.raises(GrammarError, match="abandoned"):
        future.result(0)
    other = cache.get_or_compile("other", fake)  # NOTE: a replacement worker serves it
    assert isinstance(other.result(10), CompiledGrammar)
    gate.set()
    cache.close(timeout_s=10)
    assert cache.stats().refused_entries == 0


@pytest.mark.model
def test_building_the_backends_is_not_timed_as_a_compile(tokenizer: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiler's first compile builds its backends (~1 s of tokenizer tables; much longer on
    a loaded machine) on the caller's thread, before the compile timeout starts: only the
    schema's own compile can be refused as too slow."""
    from grammarserve.fsm import GrammarCompiler, policy

    built_on: list[threading.Thread] = []
    real = policy.create_backend

    def recording(*args: Any) -> Any:
        built_on.append(threading.current_thread())
        return real(*args)

    monkeypatch.setattr(policy, "create_backend", recording)
    with GrammarCompiler(tokenizer, background_upgrade=False) as compiler:
        compiler.compile_json_schema({"type": "object", "properties": {"x": {"type": "integer"}}})
        assert built_on and all(t is threading.current_thread() for t in built_on), built_on
        other = compiler.with_backend("xgrammar")
        other.compile_regex("[ab]+")
        assert built_on[-1] is threading.current_thread()
