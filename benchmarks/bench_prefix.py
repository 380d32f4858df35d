"""Prefix caching on an agent-like workload: N sessions x T turns behind a shared ~2,000-token
preamble (system prompt + tool schemas), each turn carrying the session's growing history.

Runs the same workload with the radix cache on and off (same engine settings otherwise) and prints
one JSON line: prefill tokens computed, cache hit rate, TTFT p50 of warm vs cold requests, and
throughput. "Cold" = less than half of the prompt came from the cache.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch
from machine import stamp

TOOLS = ["search_flights", "book_hotel", "get_weather", "convert_currency", "lookup_customer",
         "create_ticket", "send_email", "schedule_meeting", "translate_text", "summarize_doc"]


def preamble(target_tokens: int, tokenizer: Any) -> str:
    """A system prompt with tool definitions, grown until it is about ``target_tokens`` long."""
    parts = ["You are an operations agent. Call tools when needed; answer briefly.\n# Tools\n"]
    i = 0
    while len(tokenizer.encode("".join(parts))) < target_tokens:
        name = TOOLS[i % len(TOOLS)]
        parts.append(json.dumps({"type": "function", "function": {
            "name": f"{name}_v{i}", "description": f"Version {i} of {name.replace('_', ' ')}.",
            "parameters": {"type": "object", "properties": {
                "query": {"type": "string", "description": "what to look up"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50},
                "region": {"type": "string", "enum": ["eu", "us", "apac"]}},
                "required": ["query"]}}}) + "\n")
        i += 1
    return "".join(parts)


def run(engine: Any, sessions: int, turns: int, pre: str, max_tokens: int) -> dict[str, Any]:
    from grammarserve import SamplingParams

    tok = engine.tokenizer
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    histories: list[list[dict[str, str]]] = [[] for _ in range(sessions)]
    ttft: dict[str, float] = {}
    cached: dict[str, tuple[int, int]] = {}
    generated = 0
    t_start = time.perf_counter()
    for t in range(turns):
        added: dict[str, float] = {}
        for s in range(sessions):
            histories[s].append({"role": "user", "content": f"Session {s}, turn {t}: check the "
                                 f"weather in city number {s * 7 + t} and book a hotel."})
            msgs = [{"role": "system", "content": pre}] + histories[s]
            rid = f"s{s}-t{t}"
            engine.add_request(rid, tok.apply_chat_template(msgs, tokenize=False,
                                                            add_generation_prompt=True), params)
            added[rid] = time.perf_counter()
        while engine.has_unfinished():
            for out in engine.step():
                now = time.perf_counter()
                ttft.setdefault(out.request_id, now - added[out.request_id])
                if out.finished:
                    generated += len(out.token_ids)
                    cached[out.request_id] = (len(out.prompt_token_ids), out.num_cached_tokens)
                    s = int(out.request_id[1:].split("-")[0])
                    histories[s].append({"role": "assistant", "content": out.text})
    wall = time.perf_counter() - t_start
    prompt_tokens = sum(p for p, _ in cached.values())
    hit = sum(c for _, c in cached.values())
    cold = [ttft[r] for r, (p, c) in cached.items() if c < p / 2]
    warm = [ttft[r] for r, (p, c) in cached.items() if c >= p / 2]
    return {
        "requests": len(cached), "prompt_tokens": prompt_tokens,
        "prefill_tokens_computed": prompt_tokens - hit,
        "cache_hit_rate": round(hit / prompt_tokens, 3),
        "ttft_p50_cold_s": round(statistics.median(cold), 3) if cold else None,
        "ttft_p50_warm_s": round(statistics.median(warm), 3) if warm else None,
        "ttft_p50_all_s": round(statistics.median(ttft.values()), 3),
        "wall_s": round(wall, 2), "requests_per_s": round(len(cached) / wall, 3),
        "generated_tok_s": round(generated / wall, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--preamble-tokens", type=int, default=2000)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from grammarserve import EngineConfig
    from grammarserve.engine.engine import Engine
    from grammarserve.models.loader import load_model

    loaded = load_model("default", device="cpu")
    pre = preamble(args.preamble_tokens, loaded.tokenizer)
    result: dict[str, Any] = {"bench": "prefix", "sessions": args.sessions, "turns": args.turns,
                              "preamble_tokens": len(loaded.tokenizer.encode(pre)),
                              "max_tokens": args.max_tokens, "threads": args.threads}
    for name, on in (("radix_on", True), ("radix_off", False)):
        cfg = EngineConfig(device="cpu", kv_cache_tokens=65536, max_num_reqs=args.sessions,
                           max_batch_tokens=2048, enable_prefix_cache=on)
        result[name] = run(Engine(cfg, loaded=loaded), args.sessions, args.turns, pre,
                           args.max_tokens)
    on, off = result["radix_on"], result["radix_off"]
    result["warm_ttft_vs_cold"] = (round(on["ttft_p50_warm_s"] / off["ttft_p50_all_s"], 3)
                                   if on["ttft_p50_warm_s"] else None)
    result["speedup_wall"] = round(off["wall_s"] / on["wall_s"], 2)
    print(json.dumps({**stamp(), **result}))


if __name__ == "__main__":
    main()
