"""What a restart costs the first request of known schemas, with the grammar disk cache
(``grammarserve/fsm/disk_cache.py``; issue 37 item 3).

For the first 100 schemas of schemas/*.json then schemas/realworld/*.json (sorted), on the
SmolLM2 tokenizer and the engine's grammar options (``EngineConfig().grammar_options``), each in
a fresh process (a subprocess, warmed up like the engine: ``GrammarCompiler.warmup``):

1. ``cold``: no disk cache; the first ``compile_json_schema`` of each schema, timed.
2. ``fill``: a disk cache in a new folder; each schema compiled, reused (its background
   upgrade runs and is written), timed from the compile to the upgraded grammar (``ready``).
3. ``restart``: a new process on that folder; the first compile of each schema, timed.

Prints one JSON line: ``{**stamp(), ...}`` with per-schema ratios restart / cold (p50, p99,
the fraction at or under 10%) of the first request, and of the time to the grammar the schema
is served with once reused (``ready``: cold, front end + first backend + upgrade; after a
restart, the first compile, which serves it from disk where the upgrade was stored).

    python benchmarks/bench_grammar_restart.py [--limit 100]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import stamp

REPO = Path(__file__).resolve().parents[1]
TARGET = 0.10


def schema_files(limit: int) -> list[Path]:
    files = sorted((REPO / "schemas").glob("*.json")) + sorted(
        (REPO / "schemas" / "realworld").glob("*.json"))
    return files[:limit]


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def worker(mode: str, folder: str | None, limit: int) -> dict[str, Any]:
    """One process's timings (``mode``: cold, fill or restart)."""
    from transformers import AutoTokenizer

    from grammarserve.config import EngineConfig
    from grammarserve.fsm import GrammarCompiler
    from grammarserve.models.loader import resolve_model_folder

    tok = AutoTokenizer.from_pretrained(str(resolve_model_folder("default")))
    options = EngineConfig().grammar_options
    options.update(crash_journal=None, disk_cache_dir=folder, upgrade_niceness=0)
    compiler = GrammarCompiler(tok, **options)
    compiler.warmup()
    out: dict[str, Any] = {}
    for path in schema_files(limit):
        schema = json.loads(path.read_text())
        start = time.perf_counter()
        try:
            grammar = compiler.compile_json_schema(schema)
        except Exception as e:  # noqa: BLE001 - refused schemas are reported, not timed
            out[path.name] = {"error": type(e).__name__}
            continue
        first = time.perf_counter() - start
        row: dict[str, Any] = {"first_s": first, "backend": grammar.backend}
        if mode == "fill":
            grammar.matcher()
            grammar.matcher()
            upgraded = grammar.upgrade_future.result() if grammar.upgrade_future else False
            row["ready_s"] = time.perf_counter() - start
            row["upgraded"] = bool(upgraded)
            compiler.flush_disk_writes()
        out[path.name] = row
    stats = compiler.cache_stats().disk
    out["__disk__"] = None if stats is None else {
        "spec_hits": stats.spec_hits, "grammar_hits": stats.grammar_hits,
        "misses": stats.misses, "writes": stats.writes, "corrupt": stats.corrupt,
        "bytes": stats.bytes}
    return out


def run(mode: str, folder: str | None, limit: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", mode, "--limit", str(limit)]
    if folder is not None:
        cmd += ["--folder", folder]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--worker", choices=["cold", "fill", "restart"], default=None)
    p.add_argument("--folder", default=None)
    args = p.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.folder, args.limit)))
        return
    with tempfile.TemporaryDirectory(prefix="grammarserve-restart-") as folder:
        cold = run("cold", None, args.limit)
        fill = run("fill", folder, args.limit)
        restart = run("restart", folder, args.limit)
    names = [n for n in cold if not n.startswith("__") and "first_s" in cold[n]
             and "first_s" in restart.get(n, {})]
    first = [restart[n]["first_s"] / cold[n]["first_s"] for n in names]
    ready = [restart[n]["first_s"] / fill[n]["ready_s"] for n in names if "ready_s" in fill[n]]
    from_xgrammar = sum(1 for n in names if restart[n]["backend"] == "xgrammar")
    ms = [cold[n]["first_s"] * 1e3 for n in names]
    rms = [restart[n]["first_s"] * 1e3 for n in names]
    line = {**stamp(), "bench": "grammar_restart", "schemas": len(names),
            "refused": args.limit - len(names),
            "restored_xgrammar": from_xgrammar, "spec_only": len(names) - from_xgrammar,
            "cold_first_ms_p50": _pct(ms, 0.5), "cold_first_ms_p99": _pct(ms, 0.99),
            "restart_first_ms_p50": _pct(rms, 0.5), "restart_first_ms_p99": _pct(rms, 0.99),
            "first_ratio_p50": _pct(first, 0.5), "first_ratio_p99": _pct(first, 0.99),
            "first_ratio_le_10pct": sum(r <= TARGET for r in first) / max(len(first), 1),
            "ready_ratio_p50": _pct(ready, 0.5), "ready_ratio_p99": _pct(ready, 0.99),
            "ready_ratio_le_10pct": sum(r <= TARGET for r in ready) / max(len(ready), 1),
            "disk_fill": fill["__disk__"], "disk_restart": restart["__disk__"]}
    print(json.dumps(line))


if __name__ == "__main__":
    main()
