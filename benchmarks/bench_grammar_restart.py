"""What a restart costs the first request of known schemas, with the grammar disk cache
(``grammarserve/fsm/disk_cache.py``; issue 37 item 3).

For the first 100 schemas of schemas/*.json then schemas/realworld/*.json (sorted; each file's
``schema``), on the SmolLM2 tokenizer and the engine's grammar options
(``EngineConfig().grammar_options``), each in a fresh process (a subprocess, warmed up like the
engine: ``GrammarCompiler.warmup``):

1. ``cold``: no disk cache; the first ``compile_json_schema`` of each schema, timed.
2. ``fill``: a disk cache in a new folder; each schema compiled, reused (its background
   upgrade runs and is written), timed from the compile to the upgraded grammar (``ready``).
3. ``restart``: a new process on that folder; each schema compiled (``first``: the stored spec,
   then llguidance as cold) and reused like in ``fill`` (``ready``: the upgrade reads xgrammar's
   grammar from disk); ``llg_build``: the ``LLMatcher`` construction within ``first``
   (llguidance's own build, which no restart skips).

Prints one JSON line: ``{**stamp(), ...}`` with absolute ms (p50, p99) of cold first, restart
first, cold ready and restart ready, and per-schema ratios (p50, p99, the fraction at or under
10%): ``first_ratio`` restart first / cold first, ``ready_ratio`` restart ready / cold ready,
``llg_floor_ratio`` llguidance's build / cold first (the least ``first_ratio`` a first request
that compiles llguidance can have) and ``llg_build_share`` (of restart first). A schema whose
upgrade does not run is ready at its first grammar (``ready_ratio_upgraded``: the others).

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
    from profile_grammar_restart import time_llguidance_builds
    from transformers import AutoTokenizer

    from grammarserve.config import EngineConfig
    from grammarserve.fsm import GrammarCompiler
    from grammarserve.models.loader import resolve_model_folder

    tok = AutoTokenizer.from_pretrained(str(resolve_model_folder("default")))
    options = EngineConfig().grammar_options
    options.update(crash_journal=None, disk_cache_dir=folder, upgrade_niceness=0)
    compiler = GrammarCompiler(tok, **options)
    compiler.warmup()
    builds = time_llguidance_builds()
    out: dict[str, Any] = {}
    for path in schema_files(limit):
        schema = json.loads(path.read_text())["schema"]
        builds.clear()
        start = time.perf_counter()
        try:
            grammar = compiler.compile_json_schema(schema)
        except Exception as e:  # noqa: BLE001 - refused schemas are reported, not timed
            out[path.name] = {"error": type(e).__name__}
            continue
        first = time.perf_counter() - start
        row: dict[str, Any] = {"first_s": first, "backend": grammar.backend,
                               "llg_build_s": builds.get("llg_build", 0.0)}
        if mode != "cold":
            grammar.matcher()
            grammar.matcher()  # NOTE: the second matcher starts the upgrade
            future = grammar.upgrade_future
            upgraded = bool(future.result()) if future is not None else False
            row["ready_s"] = time.perf_counter() - start if upgraded else first
            row["upgraded"] = upgraded
            row["ready_backend"] = grammar.backend
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
        # NOTE: read by the parent (``run``): stamped like a result line, its keys ignored there
        print(json.dumps({**stamp(), **worker(args.worker, args.folder, args.limit)}))
        return
    with tempfile.TemporaryDirectory(prefix="grammarserve-restart-") as folder:
        cold = run("cold", None, args.limit)
        fill = run("fill", folder, args.limit)
        restart = run("restart", folder, args.limit)
    names = [n for n in cold if not n.startswith("__") and "first_s" in cold[n]
             and "first_s" in restart.get(n, {}) and "ready_s" in fill.get(n, {})]

    def ms(rows: dict[str, Any], field: str) -> list[float]:
        return [rows[n][field] * 1e3 for n in names]

    def ratios(num: list[float], den: list[float]) -> list[float]:
        return [a / b for a, b in zip(num, den)]

    first = ratios(ms(restart, "first_s"), ms(cold, "first_s"))
    ready = ratios(ms(restart, "ready_s"), ms(fill, "ready_s"))
    floor = ratios(ms(restart, "llg_build_s"), ms(cold, "first_s"))
    share = ratios(ms(restart, "llg_build_s"), ms(restart, "first_s"))
    line: dict[str, Any] = {**stamp(), "bench": "grammar_restart", "schemas": len(names),
                            "refused": args.limit - len(names),
                            "restart_first_llguidance": sum(
                                restart[n]["backend"] == "llguidance" for n in names),
                            "upgraded": sum(bool(fill[n]["upgraded"]) for n in names),
                            "restart_upgraded": sum(bool(restart[n]["upgraded"]) for n in names)}
    for label, rows, field in (("cold_first", cold, "first_s"),
                               ("restart_first", restart, "first_s"),
                               ("cold_ready", fill, "ready_s"),
                               ("restart_ready", restart, "ready_s"),
                               ("restart_llg_build", restart, "llg_build_s")):
        values = ms(rows, field)
        line[f"{label}_ms_p50"], line[f"{label}_ms_p99"] = _pct(values, 0.5), _pct(values, 0.99)
    for label, values in (("first_ratio", first), ("ready_ratio", ready),
                          ("llg_floor_ratio", floor)):
        line[f"{label}_p50"], line[f"{label}_p99"] = _pct(values, 0.5), _pct(values, 0.99)
        line[f"{label}_le_10pct"] = sum(r <= TARGET for r in values) / max(len(values), 1)
    upgraded = [r for r, n in zip(ready, names) if fill[n]["upgraded"]]
    line["ready_ratio_upgraded_p50"] = _pct(upgraded, 0.5)
    line["ready_ratio_upgraded_p99"] = _pct(upgraded, 0.99)
    line["llg_build_share_p50"] = _pct(share, 0.5)
    line["disk_fill"], line["disk_restart"] = fill["__disk__"], restart["__disk__"]
    print(json.dumps(line))


if __name__ == "__main__":
    main()
