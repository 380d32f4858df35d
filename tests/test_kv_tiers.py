"""KV tiers under the radix cache (``grammarserve/engine/kv_tiers``): block keys, the host tier's
bound, pool <-> block copies, the disk tier's files (corrupt or foreign entries are misses), and
the engine on the embedded model: evicted prefixes restored from host memory and, after a
restart, from disk, with the greedy output of a freshly computed prefix and no hit across
namespaces."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from greedy_helpers import assert_same_greedy

from grammarserve.attention.kv_pool import KVPool
from grammarserve.cache_secret import ENV
from grammarserve.config import EngineConfig
from grammarserve.engine.engine import Engine
from grammarserve.engine.kv_tiers.blocks import (
    BlockLayout,
    chain_keys,
    decode,
    encode,
    gather,
    model_fingerprint,
    scatter,
)
from grammarserve.engine.kv_tiers.disk import DiskTier
from grammarserve.engine.kv_tiers.host import HostTier
from grammarserve.engine.request import RequestOutput
from grammarserve.llm import LLM
from grammarserve.sampling_params import SamplingParams


@pytest.fixture(autouse=True)
def cache_secret_file(tmp_path_factory: pytest.TempPathFactory,
                      monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's own cache secret (never the user's): the disk tier authenticates its
    entries with it (``tests/test_cache_folders_hostile.py`` tests that)."""
    path = tmp_path_factory.mktemp("config") / "cache-secret"
    monkeypatch.setenv(ENV, str(path))
    return path


def _pool(capacity: int = 512, dtype: torch.dtype = torch.float32) -> KVPool:
    pool = KVPool(capacity=capacity, num_layers=3, num_kv_heads=2, head_dim=4, dtype=dtype)
    g = torch.Generator().manual_seed(0)
    for t in pool.k + pool.v:
        t.copy_(torch.randn(t.shape, generator=g))
    return pool


def test_keys_name_the_whole_prefix_in_one_namespace() -> None:
    a = list(range(300))
    keys = chain_keys(a, "t1", "fp", 64)
    assert len(keys) == 4  # complete blocks only
    assert chain_keys(a[:200] + [9] * 100, "t1", "fp", 64)[:3] == keys[:3]
    assert chain_keys(a[:200] + [9] * 100, "t1", "fp", 64)[3] != keys[3]
    assert chain_keys([7] + a[1:], "t1", "fp", 64)[3] != keys[3]  # a block names its whole prefix
    assert set(chain_keys(a, "t2", "fp", 64)).isdisjoint(keys)
    assert set(chain_keys(a, "t1", "other-model", 64)).isdisjoint(keys)
    assert chain_keys(a, "t1", "fp", 64, start_key=keys[1], first=2) == keys[2:]


def test_host_tier_keeps_the_most_recent_blocks_within_its_bound() -> None:
    block = torch.zeros(100, dtype=torch.uint8)
    host = HostTier(350)
    for k in "abc":
        assert host.put(k, block)
    assert host.touch("a")  # now b is the oldest
    assert host.put("d", block)
    assert "b" not in host and {"a", "c", "d"} == {k for k in "acd" if k in host}
    assert host.bytes == 300 and host.evictions == 1
    assert not host.put("huge", torch.zeros(400, dtype=torch.uint8))


@pytest.mark.parametrize("store", [torch.float32, torch.float16])
def test_blocks_round_trip_the_pool(store: torch.dtype) -> None:
    pool = _pool()
    layout = BlockLayout.of(pool, store, block_tokens=8)
    slots = torch.arange(17, 33)
    blocks = gather(pool, slots, layout)
    assert [b.shape for b in blocks] == [layout.shape] * 2
    again = [decode(encode(b), layout) for b in blocks]
    assert all(b is not None for b in again)
    target = torch.arange(101, 113)  # 12 slots: the first block from position 4 on
    scatter(pool, target, [b for b in again if b is not None], offset=4)
    for i in range(3):
        want_k, got_k = pool.k[i][slots[4:]], pool.k[i][target]
        if layout.exact:
            assert torch.equal(want_k, got_k) and torch.equal(pool.v[i][slots[4:]],
                                                              pool.v[i][target])
        else:  # fp16: within its rounding of values ~N(0, 1)
            assert torch.allclose(want_k, got_k, rtol=2**-10, atol=2**-14)
    assert decode(encode(blocks[0])[:-1], layout) is None


def test_disk_tier_entries_corrupt_or_foreign_are_misses(tmp_path: Path) -> None:
    pool = _pool()
    layout = BlockLayout.of(pool, None, block_tokens=8)
    blocks = gather(pool, torch.arange(1, 17), layout)
    disk = DiskTier(str(tmp_path), 1 << 24, layout)
    assert disk.put("k0", blocks[0]) and disk.put("k1", blocks[1])
    assert disk.flush(30)
    got = disk.get("k0")
    assert got is not None and torch.equal(got, blocks[0])
    assert disk.get("nope") is None
    files = sorted(tmp_path.glob("kv-*"))
    assert len(files) == 2
    for f in files:  # one byte flipped in each payload
        data = bytearray(f.read_bytes())
        data[-5] ^= 0xFF
        f.write_bytes(bytes(data))
    assert disk.get("k0") is None and disk.get("k1") is None
    assert not list(tmp_path.glob("kv-*"))  # bad entries are removed
    other = DiskTier(str(tmp_path), 1 << 24, BlockLayout.of(pool, None, block_tokens=16))
    assert other.put("k0", gather(pool, torch.arange(1, 17), other.layout)[0])
    assert other.flush(30)
    assert disk.get("k0") is None  # another layout's payload: a miss, never a wrong block
    s = disk.stats()
    assert s.corrupt == 3 and s.hits == 1
    disk.close()
    other.close()


def test_the_fingerprint_tells_two_checkpoints_of_one_shape_apart() -> None:
    layout = BlockLayout.of(_pool(), None)
    a, b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)
    assert model_fingerprint(a, "tok", layout) == model_fingerprint(a, "tok", layout)
    assert model_fingerprint(a, "tok", layout) != model_fingerprint(b, "tok", layout)
    assert model_fingerprint(a, "tok", layout) != model_fingerprint(a, "tok2", layout)


# -- the engine on the embedded model ---------------------------------------------------------
PREAMBLE = ("You are the support assistant of tenant {t}. Policies: refunds within {d} days, "
            "shipping to {c} countries, tickets answered in {h} hours. Always answer briefly "
            "and cite the policy number. ")
GREEDY = SamplingParams(max_tokens=8, temperature=0, top_logprobs=2)


def _prompt(llm: LLM, tenant: int, question: str) -> str:
    system = PREAMBLE.format(t=tenant, d=10 + tenant, c=20 + tenant, h=tenant + 1) * 8
    return str(llm.tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": question}],
        tokenize=False, add_generation_prompt=True))


def _llm(smollm, **kw) -> LLM:  # type: ignore[no-untyped-def]
    cfg = EngineConfig(device="cpu", **{"kv_cache_tokens": 1024, "max_num_reqs": 4,
                                        "num_speculative_tokens": 0, **kw})
    return LLM.from_engine(Engine(cfg, loaded=smollm))


def _run(llm: LLM, tenant: int, question: str, namespace: str = "") -> RequestOutput:
    """One request, alone, in ``namespace`` (``LLM.generate`` has the default one only)."""
    engine = llm.engine
    rid = f"t{tenant}-{engine.stats().finished_requests}"
    engine.add_request(rid, _prompt(llm, tenant, question), GREEDY, namespace=namespace)
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished and out.request_id == rid:
                return out
    raise AssertionError("the request did not finish")


@pytest.mark.model
def test_evicted_prefixes_come_back_from_host_memory(smollm) -> None:  # type: ignore[no-untyped-def]
    fresh = _llm(smollm, enable_prefix_cache=False, kv_host_tier_bytes=0)
    tiered = _llm(smollm, kv_host_tier_bytes=1 << 30)
    plain = _llm(smollm, kv_host_tier_bytes=0)
    assert fresh.engine.tiers is None and plain.engine.tiers is None
    n = len(tiered.tokenizer(_prompt(tiered, 0, "Hi?"))["input_ids"])
    assert 4 * n > 1024  # four tenants' preambles do not fit in the pool together
    for question in ("What is the refund window?", "How fast are tickets answered?"):
        for t in range(4):
            ref = _run(fresh, t, question)
            assert_same_greedy(_run(tiered, t, question), ref)
            assert_same_greedy(_run(plain, t, question), ref)
    st, sp = tiered.engine.stats(), plain.engine.stats()
    assert st.kv_demoted_tokens > 0 and st.kv_host_hit_tokens >= 3 * 256
    assert st.cached_prompt_tokens >= sp.cached_prompt_tokens + st.kv_host_hit_tokens
    assert sp.kv_host_hit_tokens == 0


@pytest.mark.model
def test_no_tier_hit_across_namespaces(smollm) -> None:  # type: ignore[no-untyped-def]
    tiered = _llm(smollm, kv_host_tier_bytes=1 << 30)
    _run(tiered, 0, "Q?", namespace="a")
    for t in (1, 2, 3):  # push tenant 0 of namespace a out of the pool
        _run(tiered, t, "Q?", namespace="a")
    assert tiered.engine.stats().kv_demoted_tokens > 0
    out = _run(tiered, 0, "Q?", namespace="b")
    st = tiered.engine.stats()
    assert st.kv_host_hit_tokens == 0 and out.num_cached_tokens == 0
    _run(tiered, 0, "Q?", namespace="a")
    assert tiered.engine.stats().kv_host_hit_tokens > 0


@pytest.mark.model
def test_a_restarted_engine_reads_prefixes_from_disk(smollm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fresh = _llm(smollm, enable_prefix_cache=False, kv_host_tier_bytes=0)
    refs = [_run(fresh, t, "Where do you ship?") for t in range(2)]
    first = _llm(smollm, kv_host_tier_bytes=0, kv_disk_tier=str(tmp_path))
    for t in range(2):
        assert_same_greedy(_run(first, t, "Where do you ship?"), refs[t])
    first.engine.close()
    assert first.engine.stats().kv_disk_tier_writes > 0
    second = _llm(smollm, kv_host_tier_bytes=0, kv_disk_tier=str(tmp_path))
    for t in range(2):
        out = _run(second, t, "Where do you ship?")
        assert_same_greedy(out, refs[t])
        assert out.num_cached_tokens > 0
    s2 = second.engine.stats()
    assert s2.kv_disk_hit_tokens > 0 and s2.kv_disk_tier_corrupt == 0
    second.engine.close()
    for f in tmp_path.glob("kv-*"):  # every entry garbled: misses, the right output all the same
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
    third = _llm(smollm, kv_host_tier_bytes=0, kv_disk_tier=str(tmp_path))
    assert_same_greedy(_run(third, 0, "Where do you ship?"), refs[0])
    s3 = third.engine.stats()
    assert s3.kv_disk_hit_tokens == 0 and s3.kv_disk_tier_corrupt > 0
    third.engine.close()


@pytest.mark.model
def test_two_live_engines_on_one_folder_share_prompt_kv(smollm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Two replicas of one machine: what one computed, the other reads (a new replica warms)."""
    fresh = _llm(smollm, enable_prefix_cache=False, kv_host_tier_bytes=0)
    ref = _run(fresh, 3, "Do you ship abroad?")
    a = _llm(smollm, kv_host_tier_bytes=0, kv_disk_tier=str(tmp_path))
    b = _llm(smollm, kv_host_tier_bytes=0, kv_disk_tier=str(tmp_path))
    assert_same_greedy(_run(a, 3, "Do you ship abroad?"), ref)
    assert a.engine.tiers is not None and a.engine.tiers.flush(60)
    out = _run(b, 3, "Do you ship abroad?")
    assert_same_greedy(out, ref)
    assert b.engine.stats().kv_disk_hit_tokens >= out.num_cached_tokens - 64 > 0
    a.engine.close()
    b.engine.close()


@pytest.mark.model
def test_a_queued_request_is_prefetched_from_disk(smollm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """With both tiers, a queued request's blocks move from disk to host memory before its
    admission, which then reads them from memory."""
    first = _llm(smollm, kv_host_tier_bytes=0, kv_disk_tier=str(tmp_path))
    ref = _run(first, 2, "Which carrier?")
    first.engine.close()
    second = _llm(smollm, kv_host_tier_bytes=1 << 30, kv_disk_tier=str(tmp_path))
    engine = second.engine
    engine.add_request("p", _prompt(second, 2, "Which carrier?"), GREEDY)
    assert engine.tiers is not None and engine.tiers.wait_prefetched(60)
    s = engine.stats()
    assert s.kv_prefetched_tokens > 0 and s.kv_host_hit_tokens == 0
    outs = []
    while engine.has_unfinished():
        outs += [o for o in engine.step() if o.finished]
    assert_same_greedy(outs[0], ref)
    s = engine.stats()
    assert s.kv_host_hit_tokens == s.kv_prefetched_tokens and s.kv_disk_hit_tokens == 0
    engine.close()


@pytest.mark.model
def test_restores_under_contention_serve_admissions(smollm) -> None:  # type: ignore[no-untyped-def]
    """More requests than the pool holds, all queued at once: a waiting request restores its
    prefix only when it can be admitted with it, so every restored token serves a prompt (no
    restore is evicted again by the next one's)."""
    tiered = _llm(smollm, kv_host_tier_bytes=1 << 30)
    prompts = [_prompt(tiered, t, q) for q in ("A?", "B?", "C?") for t in range(4)]
    for i in range(0, len(prompts), 4):
        tiered.generate(prompts[i:i + 4], GREEDY)
    s = tiered.engine.stats()
    assert s.kv_host_hit_tokens > 0
    assert s.kv_host_hit_tokens <= s.cached_prompt_tokens


def test_gathered_blocks_own_their_storage() -> None:
    """A tier keeps blocks one by one: a kept block must not pin the rest of its gather."""
    pool = _pool()
    layout = BlockLayout.of(pool, None, block_tokens=8)
    blocks = gather(pool, torch.arange(1, 33), layout)
    assert len(blocks) == 4
    assert all(b.is_contiguous() and b.untyped_storage().nbytes() == layout.nbytes
               for b in blocks)
    assert len({b.untyped_storage().data_ptr() for b in blocks}) == 4
