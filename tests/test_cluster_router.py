"""The replica routing policies (pure Python, no Ray, no model)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from grammarserve.cluster.router import (
    PowerOfTwo,
    PrefixGrammarRouter,
    RoundRobin,
    RouterConfig,
    RouteRequest,
    grammar_key,
    make_policy,
    route_key,
)
from grammarserve.constraints import Constraint
from grammarserve.errors import InvalidRequestError

REPLICAS = [f"replica-{i}" for i in range(8)]
IDLE: dict[str, int] = {}


def prompt(system: int, user: int, *, shared: int = 200, tail: int = 30) -> list[int]:
    """A prompt: ``shared`` tokens of system prompt ``system``, then ``tail`` tokens of user
    turn ``user``."""
    rng = random.Random(system)
    head = [rng.randrange(1, 50_000) for _ in range(shared)]
    rng = random.Random(10_000 + user)
    return head + [rng.randrange(1, 50_000) for _ in range(tail)]


def test_prefix_tokens_whole_blocks_before_the_last_token() -> None:
    c = RouterConfig(block_tokens=16, max_blocks=4)
    assert c.prefix_tokens(10) == 10  # shorter than a block: all of it
    assert c.prefix_tokens(16) == 16  # no whole block before the last token
    assert c.prefix_tokens(17) == 16
    assert c.prefix_tokens(40) == 32
    assert c.prefix_tokens(1000) == 64  # at most max_blocks


def test_key_ignores_the_tail_and_splits_namespaces_and_grammars() -> None:
    c = RouterConfig()
    a = route_key(RouteRequest("", prompt(1, 1)), c)
    assert a == route_key(RouteRequest("", prompt(1, 2)), c)  # another user turn
    assert a != route_key(RouteRequest("", prompt(2, 1)), c)  # another system prompt
    assert a != route_key(RouteRequest("tenant-b", prompt(1, 1)), c)
    g = grammar_key(Constraint.json_schema({"type": "object"}))
    assert a != route_key(RouteRequest("", prompt(1, 1), g), c)


def test_grammar_key_follows_the_compile_arguments() -> None:
    assert grammar_key(None) == ""
    s1 = grammar_key(Constraint.json_schema({"type": "object", "required": ["a"]}))
    assert s1 == grammar_key(Constraint.json_schema({"required": ["a"], "type": "object"}))
    assert s1 != grammar_key(Constraint.json_schema({"type": "object"}, strict=True))
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert grammar_key(Constraint.tool_calls(tools)) != grammar_key(
        Constraint.tool_calls(tools, "auto"))


def test_same_prefix_same_replica_and_tenants_spread() -> None:
    router = PrefixGrammarRouter()
    homes = {s: {router.choose(RouteRequest("", prompt(s, u)), REPLICAS, IDLE)
                 for u in range(20)} for s in range(64)}
    assert all(len(h) == 1 for h in homes.values())
    # 64 tenants over 8 replicas: every replica is some tenant's home.
    assert {next(iter(h)) for h in homes.values()} == set(REPLICAS)


def test_rendezvous_moves_only_the_keys_of_a_removed_replica() -> None:
    router = PrefixGrammarRouter()
    reqs = [RouteRequest("", prompt(s, 0)) for s in range(200)]
    before = [router.choose(r, REPLICAS, IDLE) for r in reqs]
    gone = REPLICAS[3]
    rest = [r for r in REPLICAS if r != gone]
    after = [router.choose(r, rest, IDLE) for r in reqs]
    for b, a in zip(before, after):
        assert a == b or b == gone
    assert gone in before


def test_order_of_replicas_does_not_matter() -> None:
    router = PrefixGrammarRouter()
    req = RouteRequest("ns", prompt(5, 5), "g")
    shuffled = list(reversed(REPLICAS))
    assert router.choose(req, REPLICAS, IDLE) == router.choose(req, shuffled, IDLE)


def test_overloaded_home_falls_back_to_the_less_loaded_runner_up() -> None:
    router = PrefixGrammarRouter(RouterConfig(queue_threshold=4, load_factor=1.5))
    req = RouteRequest("", prompt(7, 0))
    first, second = router.ranked(req, REPLICAS)[:2]
    # At the threshold: stays home.
    assert router.choose(req, REPLICAS, {first: 4}) == first
    assert not router.last_fallback
    # Above it (mean is small): the runner-up, always the same one for this key.
    assert router.choose(req, REPLICAS, {first: 5}) == second
    assert router.last_fallback
    # The runner-up is as busy: stay home.
    assert router.choose(req, REPLICAS, {first: 9, second: 9}) == first
    # Everyone is busy: the home is not above load_factor x mean.
    busy = dict.fromkeys(REPLICAS, 10) | {first: 14}
    assert router.choose(req, REPLICAS, busy) == first


def test_one_replica_and_no_replica() -> None:
    for name in ("prefix_grammar", "power_of_two", "round_robin"):
        policy = make_policy(name, seed=0)
        assert policy.choose(RouteRequest("", [1, 2, 3]), ["only"], {"only": 99}) == "only"
        with pytest.raises(ValueError, match="no replica"):
            policy.choose(RouteRequest("", [1]), [], IDLE)


def test_round_robin_cycles() -> None:
    rr = RoundRobin()
    got = [rr.choose(RouteRequest("", [1]), REPLICAS[:3], IDLE) for _ in range(6)]
    assert got == REPLICAS[:3] * 2


def test_power_of_two_prefers_the_less_loaded() -> None:
    p2 = PowerOfTwo(seed=1)
    loads = {REPLICAS[0]: 0} | {r: 10 for r in REPLICAS[1:]}
    picks = Counter(p2.choose(RouteRequest("", [1]), REPLICAS, loads) for _ in range(400))
    # Replica 0 is in the drawn pair 2/8 of the time and then always wins.
    assert 60 <= picks[REPLICAS[0]] <= 140
    assert PowerOfTwo(seed=3).choose(RouteRequest("", [1]), REPLICAS[:2], {REPLICAS[1]: 0,
                                                                        REPLICAS[0]: 1}) \
        == REPLICAS[1]


def test_bad_config_and_unknown_policy_are_refused() -> None:
    with pytest.raises(InvalidRequestError):
        RouterConfig(block_tokens=0)
    with pytest.raises(InvalidRequestError):
        RouterConfig(load_factor=0.5)
    with pytest.raises(InvalidRequestError, match="unknown router"):
        make_policy("random")


def test_simulation_prefix_router_keeps_prefixes_where_round_robin_scatters_them() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import bench_router

    samples = [{"prompt_tokens": 800, "shared_tokens": 780, "completion_tokens": 40,
                "compile_cold_s": 0.03, "compile_hit_s": 0.003, "prefill_cold_s": 6.0,
                "prefill_warm_s": 0.2, "decode_batch_s": 2.0}]
    got = {p: bench_router.simulate(samples, 4, p, per_tenant=16, kv_tokens=8192)
           for p in ("round_robin", "prefix_grammar")}
    rr, ours = got["round_robin"], got["prefix_grammar"]
    assert rr["requests"] == ours["requests"] == 4 * 4 * 16
    assert ours["prefix_cache_hit_rate"] > 0.8 > rr["prefix_cache_hit_rate"]
    assert ours["grammar_cache_hit_rate"] > rr["grammar_cache_hit_rate"]
