"""Markdown table of a side_by_side.sh results file (JSON lines from bench_serving.py --label).

    python benchmarks/peers/table.py RESULTS.jsonl

One row per (workload, server); ratio columns compare grammarserve with each peer on the same
workload: req/s and tok/s as grammarserve/peer (> 1: grammarserve faster), p50 latency as
grammarserve/peer (< 1: grammarserve faster). For each server and workload the last line wins.
"""

from __future__ import annotations

import json
import sys
from typing import Any

US = "grammarserve"


def variant(r: dict[str, Any]) -> str:
    w = str(r["workload"])
    if w == "tools" and r.get("strict_tools"):
        w += " (strict)"
    return w


def fmt(x: Any, nd: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def ratio(a: Any, b: Any) -> str:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or not b:
        return "-"
    return f"{a / b:.2f}x"


def main() -> None:
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    startup: dict[str, Any] = {}
    failed: list[str] = []
    with open(sys.argv[1]) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            server = r.get("server", "?")
            if r.get("event") == "startup":
                startup[server] = r.get("startup_s")
            elif r.get("event"):
                failed.append(f"{server}: {r['event']}" + (f" ({r['workload']})"
                                                             if "workload" in r else ""))
            elif "workload" in r:
                rows[(variant(r), server)] = r
    workloads = list(dict.fromkeys(w for w, _ in rows))
    servers = list(dict.fromkeys(s for _, s in rows))
    servers.sort(key=lambda s: s != US)
    print("| workload | server | req/s | tok/s | TTFT p50 s | latency p50 s | ITL p50 ms | "
          "valid % | cut | errors | req/s gs/peer | tok/s gs/peer | p50 latency gs/peer |")
    print("|" + "---|" * 13)
    for w in workloads:
        ours = rows.get((w, US))
        for s in servers:
            r = rows.get((w, s))
            if r is None:
                continue
            itl = r.get("itl_p50")
            cells = [w, s, fmt(r.get("requests_per_s"), 3), fmt(r.get("completion_tok_per_s"), 1),
                     fmt(r.get("ttft_p50"), 3), fmt(r.get("latency_p50"), 2),
                     fmt(itl * 1000 if itl is not None else None, 1), fmt(r.get("valid_pct"), 1),
                     fmt(r.get("cut_by_length")), fmt(r.get("errors"))]
            if s != US and ours is not None:
                cells += [ratio(ours.get("requests_per_s"), r.get("requests_per_s")),
                          ratio(ours.get("completion_tok_per_s"), r.get("completion_tok_per_s")),
                          ratio(ours.get("latency_p50"), r.get("latency_p50"))]
            else:
                cells += ["", "", ""]
            print("| " + " | ".join(cells) + " |")
    if startup:
        print()
        print("Start-up to healthy: " + ", ".join(f"{s} {v} s" for s, v in startup.items()))
    for line in failed:
        print(f"- failed: {line}")
    for (w, s), r in rows.items():
        if r.get("first_error"):
            print(f"- {s} {w}: {r['errors']} errors, first: {r['first_error']}")


if __name__ == "__main__":
    main()
