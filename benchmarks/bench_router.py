"""Replica routing at cluster size: a simulation that replays measured per-request service times
through the routing policies (round-robin, power-of-two, ours: prefix + grammar rendezvous
bounded by load) for 8, 32 and 128 replicas, on the multi-tenant workload of
``router_workload.py`` (4 tenants per replica x 32 requests, interleaved, Poisson arrivals).

Prints one JSON line: per replica count and policy, the prefix cache hit rate (cached prompt
tokens / prompt tokens), the grammar cache hit rate (constrained requests that found their
grammar compiled or compiling / all), throughput (requests/s of simulated time) and TTFT p95.

``--live`` runs the workload through the Ray Serve application instead (2 replicas of the
embedded model on a local Ray instance, once per policy; ``router_live.py``).

Service times come from ``benchmarks/data/router_service_times.json``, measured on the embedded
model by ``--measure`` (which rewrites that file); the model of one replica is in
:func:`simulate`. Run ``--measure`` again on the machine you want to judge.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import router_workload as wl
from machine import stamp

from grammarserve.cluster.router import RouterConfig, RouteRequest, make_policy

DATA = Path(__file__).resolve().parent / "data" / "router_service_times.json"
POLICIES = ("round_robin", "power_of_two", "prefix_grammar")


# -- measuring (the embedded model, in-process) ----------------------------------------------------
def _run_alone(engine: Any, rid: str, prompt: list[int], params: Any) -> tuple[float, float, Any]:
    """(TTFT, decode seconds, final output) of one request run with nothing beside it."""
    t0 = time.perf_counter()
    engine.add_request(rid, prompt, params)
    ttft = None
    while True:
        for out in engine.step():
            if ttft is None and out.token_ids:
                ttft = time.perf_counter() - t0
            if out.finished:
                t1 = time.perf_counter()
                assert ttft is not None
                return ttft, t1 - t0 - ttft, out


def measure(tenants: int, batch: int, kv_tokens: int | None) -> dict[str, Any]:
    """Per tenant: compile (cold, cached), prefill (cold, warm) and decode time at ``batch``."""
    from grammarserve.config import EngineConfig
    from grammarserve.engine.engine import Engine
    from grammarserve.openai.context import ModelContext
    from grammarserve.openai.prepare import prepare_chat
    from grammarserve.openai.protocol import ChatCompletionRequest

    config = EngineConfig(kv_cache_tokens=kv_tokens)
    engine = Engine(config)
    ctx = ModelContext.create(engine.tokenizer, engine.grammar.compiler,
                              max_model_len=engine.max_model_len, max_n=1, model_name="bench",
                              tool_call_format=config.tool_call_format)

    def prepared(t: int, j: int) -> tuple[Any, float]:
        t0 = time.perf_counter()
        prep = prepare_chat(ctx, ChatCompletionRequest.model_validate(wl.chat_body(t, j)))
        assert prep.compiled is not None
        prep.compiled.result()
        return prep, time.perf_counter() - t0

    warm_up, _ = prepared(10_000, 0)  # first compiles and first forward shapes: not counted
    _run_alone(engine, "warm-up", warm_up.prompts[0], warm_up.params[0])
    samples = []
    for t in range(tenants):
        cold, compile_cold = prepared(t, 0)
        prefill_cold, _, _ = _run_alone(engine, f"{t}-0", cold.prompts[0], cold.params[0])
        warm, compile_hit = prepared(t, 1)
        prefill_warm, decode_alone, out = _run_alone(engine, f"{t}-1", warm.prompts[0],
                                                     warm.params[0])
        # Decode beside batch - 1 others (warm prefix): what a request's decode costs in a batch.
        preps = [prepared(t, j)[0] for j in range(2, 2 + batch)]
        t0 = time.perf_counter()
        first: dict[str, float] = {}
        done: dict[str, tuple[float, int]] = {}
        for j, p in enumerate(preps):
            engine.add_request(f"{t}-b{j}", p.prompts[0], p.params[0])
        while engine.has_unfinished():
            for o in engine.step():
                now = time.perf_counter() - t0
                if o.token_ids:
                    first.setdefault(o.request_id, now)
                if o.finished:
                    done[o.request_id] = (now, len(o.token_ids))
        decode_batch = statistics.mean(done[r][0] - first[r] for r in done)
        samples.append({"tenant": t, "prompt_tokens": len(warm.prompts[0]),
                        "shared_tokens": out.num_cached_tokens,
                        "completion_tokens": round(statistics.mean(d[1] for d in done.values())),
                        "compile_cold_s": round(compile_cold, 4),
                        "compile_hit_s": round(compile_hit, 4),
                        "prefill_cold_s": round(prefill_cold, 4),
                        "prefill_warm_s": round(prefill_warm, 4),
                        "decode_alone_s": round(decode_alone, 4),
                        "decode_batch_s": round(decode_batch, 4)})
        print(json.dumps(samples[-1]), file=sys.stderr)
    return {"measured": time.strftime("%Y-%m-%d %H:%M"), "batch": batch,
            "command": " ".join(["benchmarks/bench_router.py"] + sys.argv[1:]),
            "model": "SmolLM2-135M-Instruct (embedded GGUF), CPU", "samples": samples}


# -- the simulation --------------------------------------------------------------------------------
class RadixLRU:
    """A replica's KV cache as the radix cache evicts it: entries (a tenant's prefix, a
    request's own tokens under it) with sizes; beyond ``capacity`` the least recently used entry
    with no entry under it goes first (a prefix outlives the requests hanging under it)."""

    def __init__(self, capacity: float) -> None:
        self.capacity = capacity
        self.items: OrderedDict[Any, tuple[float, Any]] = OrderedDict()  # key -> (size, parent)
        self.children: dict[Any, int] = {}
        self.size = 0.0

    def hit(self, key: Any) -> bool:
        if key in self.items:
            self.items.move_to_end(key)
            return True
        return False

    def put(self, key: Any, size: float, parent: Any = None) -> None:
        if key in self.items:
            self.items.move_to_end(key)
            return
        if parent is not None and parent not in self.items:
            parent = None  # its prefix was evicted meanwhile: a root of its own
        self.items[key] = (size, parent)
        self.size += size
        if parent is not None:
            self.children[parent] = self.children.get(parent, 0) + 1
        while self.size > self.capacity and self.items:
            victim = next(k for k in self.items if not self.children.get(k))
            size, up = self.items.pop(victim)
            self.size -= size
            self.children.pop(victim, None)
            if up is not None:
                self.children[up] -= 1


@dataclass
class Replica:
    """One simulated engine: prefix (KV) and grammar caches, prefill server, batch slots."""

    kv: RadixLRU
    grammars: RadixLRU
    compiling: dict[str, float] = field(default_factory=dict)  # grammar -> ready at
    in_system: int = 0
    slots_free: int = 0
    waiting: list[tuple[float, int]] = field(default_factory=list)  # (ready at, request)
    prefill_free_at: float = 0.0


def simulate(samples: list[dict[str, Any]], replicas: int, policy_name: str, *,
             tenants_per_replica: int = 4, per_tenant: int = 32, kv_tokens: int = 8192,
             grammar_entries: int = 1000, slots: int = 4, load: float = 0.7,
             seed: int = 0, router: RouterConfig | None = None) -> dict[str, Any]:
    """One run of the workload through ``replicas`` simulated engines.

    A replica compiles a grammar it has not seen (in the background; requests of the same
    grammar share the compile), then admits the request when one of its ``slots`` batch rows is
    free; prefills run one at a time (a prefill holds up the batch), a cached prefix costing the
    measured warm time and a miss the cold one; then the request decodes for the measured
    in-batch decode time beside the others. The tenant's prefix enters the replica's KV cache
    when its prefill ends, each request's own tokens when it finishes; the KV cache is an LRU of
    ``kv_tokens``. Arrivals are Poisson at ``load`` x the capacity of an ideal router (each
    tenant's prefix cold once in the whole cluster, warm after; perfectly balanced).
    """
    rng = random.Random(seed)
    tenants = tenants_per_replica * replicas
    order = wl.interleaved(tenants, per_tenant, seed)
    policy = make_policy(policy_name, config=router, seed=seed)
    ids = [f"replica-{i}" for i in range(replicas)]
    reps = {r: Replica(RadixLRU(kv_tokens), RadixLRU(grammar_entries), slots_free=slots) for r in ids}
    mean = {k: statistics.mean(s[k] for s in samples)
            for k in ("prefill_warm_s", "prefill_cold_s", "decode_batch_s")}
    # The ideal router's prefill: each tenant's prefix cold once, then warm.
    prefill = (mean["prefill_cold_s"] + (per_tenant - 1) * mean["prefill_warm_s"]) / per_tenant
    capacity = min(1 / prefill, slots / (prefill + mean["decode_batch_s"]))
    rate = load * replicas * capacity
    events: list[tuple[float, int, str, int]] = []  # (time, seq, kind, request)
    seq = 0

    def push(at: float, kind: str, i: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (at, seq, kind, i))

    now = 0.0
    arrival: list[float] = []
    for i in range(len(order)):
        now += rng.expovariate(rate)
        arrival.append(now)
        push(now, "arrive", i)
    where: dict[int, str] = {}
    ttft: dict[int, float] = {}
    cached = prompt = grammar_hits = 0
    finish = 0.0

    def sample(i: int) -> dict[str, Any]:
        return samples[order[i][0] % len(samples)]

    def admit(rep: Replica, at: float) -> None:
        """Start prefills while slots are free (in order of grammar readiness)."""
        nonlocal cached, prompt
        while rep.slots_free and rep.waiting and rep.waiting[0][0] <= at:
            _, i = heapq.heappop(rep.waiting)
            rep.slots_free -= 1
            s, t = sample(i), order[i][0]
            hit = rep.kv.hit(("prefix", t))
            cached += s["shared_tokens"] if hit else 0
            prompt += s["prompt_tokens"]
            start = max(at, rep.prefill_free_at)
            end = start + s["prefill_warm_s" if hit else "prefill_cold_s"]
            rep.prefill_free_at = end
            rep.kv.put(("prefix", t), s["shared_tokens"])
            push(end, "first", i)

    while events:
        now, _, kind, i = heapq.heappop(events)
        t, j = order[i]
        s = sample(i)
        if kind == "arrive":
            key = json.dumps(wl.tenant_tools(t))  # the tenant's grammar (tools, required)
            req = RouteRequest("", [t] * s["shared_tokens"] + [j + 1] * 16, key)
            loads = {r: reps[r].in_system for r in ids}
            r = where[i] = policy.choose(req, ids, loads)
            rep = reps[r]
            rep.in_system += 1
            if rep.grammars.hit(key):
                ready = now + s["compile_hit_s"]
                grammar_hits += 1
            elif key in rep.compiling and rep.compiling[key] > now:
                ready = rep.compiling[key]
                grammar_hits += 1
            else:
                ready = rep.compiling[key] = now + s["compile_cold_s"]
                push(ready, "compiled", i)
            heapq.heappush(rep.waiting, (ready, i))
            push(ready, "ready", i)
        elif kind == "compiled":
            rep = reps[where[i]]
            rep.grammars.put(json.dumps(wl.tenant_tools(t)), 1)
        elif kind == "ready":
            admit(reps[where[i]], now)
        elif kind == "first":
            ttft[i] = now - arrival[i]
            push(now + s["decode_batch_s"], "done", i)
        elif kind == "done":
            rep = reps[where[i]]
            rep.in_system -= 1
            rep.slots_free += 1
            rep.kv.put(("tail", i), s["prompt_tokens"] - s["shared_tokens"]
                       + s["completion_tokens"], ("prefix", t))
            finish = now
            admit(rep, now)
    n = len(order)
    ttfts = sorted(ttft.values())
    per_replica = [sum(1 for r in where.values() if r == x) for x in ids]
    return {"replicas": replicas, "policy": policy_name, "tenants": tenants, "requests": n,
            "prefix_cache_hit_rate": round(cached / prompt, 4),
            "grammar_cache_hit_rate": round(grammar_hits / n, 4),
            "throughput_req_s": round(n / (finish - arrival[0]), 3),
            "ttft_p50_s": round(ttfts[n // 2], 3),
            "ttft_p95_s": round(ttfts[min(n - 1, int(0.95 * n))], 3),
            "max_replica_share": round(max(per_replica) / (n / replicas), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", default="8,32,128")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--tenants-per-replica", type=int, default=4)
    ap.add_argument("--per-tenant", type=int, default=32)
    ap.add_argument("--kv-tokens", type=int, default=8192,
                    help="KV cache tokens of one simulated replica")
    ap.add_argument("--slots", type=int, default=4, help="batch rows of one simulated replica")
    ap.add_argument("--load", type=float, default=0.7,
                    help="arrival rate as a share of the capacity with an ideal router (each "
                         "tenant's prefix cold once, then warm, load perfectly balanced)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--measure", action="store_true",
                    help=f"measure service times on the embedded model first (rewrites {DATA})")
    ap.add_argument("--measure-tenants", type=int, default=4)
    ap.add_argument("--live", action="store_true",
                    help="instead: the workload through the Ray Serve app (router_live.py)")
    ap.add_argument("--live-replicas", type=int, default=2)
    ap.add_argument("--live-tenants", type=int, default=8)
    ap.add_argument("--live-per-tenant", type=int, default=32)
    ap.add_argument("--live-kv-tokens", type=int, default=4096)
    ap.add_argument("--live-concurrency", type=int, default=8)
    ap.add_argument("--live-max-tokens", type=int, default=16)
    args = ap.parse_args()
    if args.live:
        import router_live

        live = [router_live.run_policy(
            p, replicas=args.live_replicas, tenants=args.live_tenants,
            per_tenant=args.live_per_tenant, kv_tokens=args.live_kv_tokens,
            concurrency=args.live_concurrency, max_tokens=args.live_max_tokens)
            for p in args.policies.split(",")]
        print(json.dumps({**stamp(), "bench": "router_live", "kv_tokens": args.live_kv_tokens,
                          "concurrency": args.live_concurrency,
                          "max_tokens": args.live_max_tokens, "results": live}))
        return
    if args.measure:
        data = measure(args.measure_tenants, args.slots, None)
        DATA.write_text(json.dumps(data, indent=1) + "\n")
    data = json.loads(DATA.read_text())
    results = [simulate(data["samples"], int(r), p, tenants_per_replica=args.tenants_per_replica,
                        per_tenant=args.per_tenant, kv_tokens=args.kv_tokens, slots=args.slots,
                        load=args.load, seed=args.seed)
               for r in args.replicas.split(",") for p in args.policies.split(",")]
    print(json.dumps({**stamp(), "bench": "router_simulation", "service_times": str(DATA.name),
                      "measured": data["measured"], "kv_tokens": args.kv_tokens,
                      "slots": args.slots, "load": args.load, "results": results}))


if __name__ == "__main__":
    main()
