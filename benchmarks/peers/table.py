"""Markdown table of a side_by_side.sh results file (JSON lines from bench_serving.py --label).

    python benchmarks/peers/table.py RESULTS.jsonl

One row per (workload, server). The headline columns come first, for constrained workloads
(``figures.py``): success % (valid replies among *all* requests, with the count), goodput (valid
replies per second), validity among the replies not cut by ``max_tokens``, and the number cut.
Ratio columns compare grammarserve with each peer on the same workload: goodput, req/s and tok/s
as grammarserve/peer (> 1: grammarserve better), p50 latency as grammarserve/peer (< 1:
grammarserve faster). For each server and workload the last line wins. ``decode`` rows
(bench_stream.py) show single-stream decode tokens/s in the tok/s column and its TTFT.

Lines written before bench_serving.py reported the success figures (no ``success_pct``) get
them derived from ``valid_pct``, ``completed``, ``cut_by_length`` and ``wall_s`` (the same
definitions; such rows are marked with a ``*``).
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
    if w == "tools" and r.get("parallel_tool_calls") is False:
        w += " (no parallel)"
    style = r.get("few_shot_style")
    if style and style != "spaced":
        w += " (no examples)" if style == "none" else f" ({style} examples)"
    return w


def with_success(r: dict[str, Any]) -> dict[str, Any]:
    """``r`` with the success figures, derived for lines that predate them."""
    if "success_pct" in r or r.get("workload") == "chat" or r.get("valid_pct") is None:
        return r
    requests, cut = r.get("requests"), r.get("cut_by_length") or 0
    finished = (r.get("completed") or 0) - cut
    valid = round(r["valid_pct"] * finished / 100)
    return {**r, "derived": True, "valid_replies": valid,
            "success_pct": round(100.0 * valid / requests, 1) if requests else None,
            "goodput_valid_per_s": round(valid / r["wall_s"], 4) if r.get("wall_s") else None,
            "valid_of_finished_pct": r["valid_pct"]}


def success_cell(r: dict[str, Any]) -> str:
    if r.get("success_pct") is None:
        return "-"
    cell = f"{r['success_pct']:.1f} ({r.get('valid_replies')}/{r.get('requests')})"
    return cell + ("*" if r.get("derived") else "")


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
            elif r.get("bench") == "stream":  # bench_stream.py: single-stream decode tok/s
                rows[(variant(r), server)] = {**r, "completion_tok_per_s": r.get("decode_tok_s"),
                                              "ttft_p50": r.get("ttft_s")}
            elif "workload" in r:
                rows[(variant(r), server)] = with_success(r)
    workloads = list(dict.fromkeys(w for w, _ in rows))
    servers = list(dict.fromkeys(s for _, s in rows))
    servers.sort(key=lambda s: s != US)
    print("| workload | server | success % (valid/all) | goodput valid/s | valid % of finished | "
          "cut by max_tokens | errors | req/s | tok/s | TTFT p50 s | latency p50 s | ITL p50 ms | "
          "goodput gs/peer | req/s gs/peer | tok/s gs/peer | p50 latency gs/peer |")
    print("|" + "---|" * 16)
    for w in workloads:
        ours = rows.get((w, US))
        for s in servers:
            r = rows.get((w, s))
            if r is None:
                continue
            itl = r.get("itl_p50")
            cells = [w, s, success_cell(r), fmt(r.get("goodput_valid_per_s"), 3),
                     fmt(r.get("valid_of_finished_pct", r.get("valid_pct")), 1),
                     fmt(r.get("cut_by_length")), fmt(r.get("errors")),
                     fmt(r.get("requests_per_s"), 3), fmt(r.get("completion_tok_per_s"), 1),
                     fmt(r.get("ttft_p50"), 3), fmt(r.get("latency_p50"), 2),
                     fmt(itl * 1000 if itl is not None else None, 1)]
            if s != US and ours is not None:
                cells += [ratio(ours.get("goodput_valid_per_s"), r.get("goodput_valid_per_s")),
                          ratio(ours.get("requests_per_s"), r.get("requests_per_s")),
                          ratio(ours.get("completion_tok_per_s"), r.get("completion_tok_per_s")),
                          ratio(ours.get("latency_p50"), r.get("latency_p50"))]
            else:
                cells += ["", "", "", ""]
            print("| " + " | ".join(cells) + " |")
    if startup:
        print()
        print("Start-up to healthy: " + ", ".join(f"{s} {v} s" for s, v in startup.items()))
    if any(r.get("derived") for r in rows.values()):
        print("\n* derived from valid_pct, completed and cut_by_length (a line written before "
              "bench_serving.py reported success_pct)")
    for line in failed:
        print(f"- failed: {line}")
    for (w, s), r in rows.items():
        if r.get("first_error"):
            print(f"- {s} {w}: {r['errors']} errors, first: {r['first_error']}")


if __name__ == "__main__":
    main()
