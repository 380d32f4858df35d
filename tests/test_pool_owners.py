"""Every thread pool has an owner that shuts it down (``grammarserve/fsm/pools.py``): a compiler's
upgrade, style and value-check pools end with ``GrammarCompiler.close()`` (a ``with_backend``
copy owns its own), the engine's mask worker with ``GrammarRunner.shutdown()``, the KV
prefetcher with ``KVTiers.close()`` (all three from ``Engine.close()``). After the close no
thread of those pools is left (joined with a deadline)."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from grammarserve.attention.kv_pool import KVPool
from grammarserve.config import EngineConfig
from grammarserve.engine.grammar import GrammarRunner
from grammarserve.engine.kv_tiers.blocks import BlockLayout
from grammarserve.engine.kv_tiers.tiers import KVTiers
from grammarserve.fsm import GrammarCompiler

#: Name prefixes of the owned pools' threads (and the KV disk tier's writer).
POOLS = ("grammarserve-upgrade", "grammarserve-style", "grammarserve-checks", "grammar-mask",
         "kv-prefetch", "kv-disk-writer")
SCHEMA = {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True,
                                                 "items": {"type": "integer"}}},
          "required": ["a"], "additionalProperties": False}


@pytest.fixture(scope="module")
def byte_tokenizer() -> Any:
    from tiny_models import eos_byte_tokenizer

    return eos_byte_tokenizer()


def _pool_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t not in before and t.name.startswith(POOLS)]


def _left_after_join(threads: list[threading.Thread], timeout: float = 60.0) -> list[str]:
    """The names of ``threads`` still alive after joining each for up to ``timeout``."""
    for t in threads:
        t.join(timeout)
    return [t.name for t in threads if t.is_alive()]


def test_a_closed_compiler_and_its_backend_copy_leave_no_pool_thread(
        byte_tokenizer: Any) -> None:
    before = set(threading.enumerate())
    compiler = GrammarCompiler(byte_tokenizer)  # upgrades and per-style grammars on reuse
    grammar = compiler.compile_json_schema(SCHEMA)  # a value check: a check plan
    upgrade = grammar.request_upgrade()
    assert upgrade is not None
    upgrade.result(timeout=60)
    styles = GrammarCompiler(byte_tokenizer, background_upgrade=False)  # styles side by side
    styles.compile_json_schema(SCHEMA)
    other = compiler.with_backend("llguidance")
    other.compile_json_schema({**SCHEMA, "title": "another"})
    started = {t.name.rsplit("_", 1)[0] for t in _pool_threads(before)}
    assert {"grammarserve-upgrade", "grammarserve-style", "grammarserve-checks"} <= started
    for owner in (other, styles, compiler):
        owner.close()
    assert _left_after_join(_pool_threads(before)) == []


def test_a_shut_down_grammar_runner_leaves_no_pool_thread(byte_tokenizer: Any) -> None:
    before = set(threading.enumerate())
    config = EngineConfig(device="cpu", max_num_reqs=2).resolved()
    runner = GrammarRunner(byte_tokenizer, config, vocab_size=len(byte_tokenizer),
                           stop_token_ids=[0])
    matcher = runner.compiler.compile_json_schema(SCHEMA).matcher()
    req: Any = SimpleNamespace(matcher=matcher, draft=[], error=None)
    filled = runner.fill_async([req]).result(timeout=60)
    assert filled is not None and filled[1] == []
    assert any(t.name.startswith("grammar-mask") for t in _pool_threads(before))
    runner.shutdown()
    assert _left_after_join(_pool_threads(before)) == []
    again = runner.fill_async([req])  # after shutdown: on the caller's thread
    assert again.done() and again.result() is not None
    assert _pool_threads(before) == []


def test_closed_kv_tiers_leave_no_pool_thread(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    pool = KVPool(capacity=256, num_layers=2, num_kv_heads=2, head_dim=4, dtype=torch.float32)
    layout = BlockLayout.of(pool, torch.float32, block_tokens=8)
    tiers = KVTiers(pool, layout, "fp", host_bytes=1 << 20, disk_dir=str(tmp_path),
                    disk_bytes=1 << 20)
    tiers.prefetch(list(range(32)), "ns", 0)
    assert tiers.wait_prefetched(60)
    assert any(t.name.startswith("kv-prefetch") for t in _pool_threads(before))
    tiers.close()
    assert _left_after_join(_pool_threads(before)) == []
    tiers.prefetch(list(range(32)), "ns", 0)  # closed: a hint dropped, no thread started
    assert _pool_threads(before) == []
