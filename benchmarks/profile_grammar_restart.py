"""Where a restarted first compile's time goes (``bench_grammar_restart.py``'s ``restart``):
perf_counter sections around the stages of ``compile_json_schema`` on a compiler whose disk
cache holds each schema's spec (filled by a first compiler in this process; the one timed is a
new one, warmed up like the engine's).

Stages (ms per schema; p50 and mean over the schemas): ``spec`` (the front end's memo and disk
read: its key, the entry read and verified, ``spec_from_json``), ``queue`` (the hand-off to a
compile worker and back), ``llg_text`` (llguidance's grammar text of the schema:
``grammar_from_json_schema``), ``llg_build`` (``LLMatcher`` construction: llguidance's own
build), ``llg_range`` (its exclusive-range check), ``llg_other`` (the rest of the backend compile), ``start_mask`` (the policy's start mask
of a staged grammar), ``probe`` (``compiler._probe``), ``policy_other`` and ``total``.

    python benchmarks/profile_grammar_restart.py [--limit 30] [--style flexible|auto] \
        [--corpus schemas/realworld]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import stamp

REPO = Path(__file__).resolve().parents[1]
_T: dict[str, float] = defaultdict(float)


def _timed(owner: Any, name: str, stage: str) -> None:
    inner = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            _T[stage] += time.perf_counter() - start

    setattr(owner, name, wrapper)


class _TimedLLMatcher:
    """``llguidance.LLMatcher`` with its construction timed (the class's statics pass through)."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self._real(*args, **kwargs)
        finally:
            _T["llg_build"] += time.perf_counter() - start

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _Module:
    def __init__(self, real: Any) -> None:
        self._real = real
        self.LLMatcher = _TimedLLMatcher(real.LLMatcher)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def time_llguidance_builds() -> dict[str, float]:
    """Time ``LLMatcher`` constructions from now on (the llguidance backend's); returns the
    counters (``llg_build``: seconds so far; clear it to start over)."""
    from grammarserve.fsm.backends import llguidance_backend as llg

    if not isinstance(llg.llguidance, _Module):
        llg.llguidance = _Module(llg.llguidance)  # type: ignore[assignment]
    return _T


def _instrument() -> None:
    from grammarserve.fsm import compiler, disk_cache, policy
    from grammarserve.fsm.backends import llguidance_backend as llg

    _timed(compiler.GrammarCompiler, "_memo_spec", "spec")
    _timed(compiler.GrammarCompiler, "_compile", "worker")
    _timed(compiler.GrammarCompiler, "_probe", "probe")
    _timed(policy.BackendPolicy, "compile", "policy")
    _timed(policy.BackendPolicy, "_start_mask", "start_mask")
    _timed(disk_cache.DiskCache, "get", "spec_read")
    _timed(disk_cache, "spec_from_json", "spec_json")
    _timed(llg.LLGuidanceBackend, "compile", "llg")
    _timed(llg.LLGuidanceBackend, "grammar_text", "llg_text")
    _timed(llg, "unit_exclusive_range_text", "llg_range")
    time_llguidance_builds()


def _row(timings: dict[str, float], total: float) -> dict[str, float]:
    t = defaultdict(float, timings)
    llg_other = t["llg"] - t["llg_text"] - t["llg_build"] - t["llg_range"]
    row = {"spec": t["spec"], "spec_read": t["spec_read"], "spec_json": t["spec_json"],
           "queue": total - t["spec"] - t["worker"], "llg_text": t["llg_text"],
           "llg_build": t["llg_build"], "llg_range": t["llg_range"], "llg_other": llg_other, "start_mask": t["start_mask"],
           "probe": t["probe"],
           "policy_other": t["policy"] - t["llg"] - t["start_mask"],
           "worker_other": t["worker"] - t["policy"] - t["probe"], "total": total}
    return {k: v * 1e3 for k, v in row.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--limit", type=int, default=30)
    p.add_argument("--style", default=None, help="json_style (default: the engine's)")
    p.add_argument("--corpus", default="schemas/realworld", help="a folder of schema files")
    args = p.parse_args()
    sys.path.append(str(REPO))  # NOTE: last: the root's kernels/ must not hide `kernels`
    from transformers import AutoTokenizer

    from grammarserve.config import EngineConfig
    from grammarserve.fsm import GrammarCompiler
    from grammarserve.models.loader import resolve_model_folder

    tok = AutoTokenizer.from_pretrained(str(resolve_model_folder("default")))
    files = sorted((REPO / args.corpus).glob("*.json"))[:args.limit]
    schemas = [json.loads(f.read_text())["schema"] for f in files]
    with tempfile.TemporaryDirectory(prefix="grammarserve-profile-") as folder:
        options = EngineConfig().grammar_options
        options.update(crash_journal=None, disk_cache_dir=folder, upgrade_niceness=0)
        if args.style is not None:
            options["json_style"] = args.style
        make: Callable[[], GrammarCompiler] = lambda: GrammarCompiler(tok, **options)
        fill = make()
        for schema in schemas:
            fill.compile_json_schema(schema)
        fill.flush_disk_writes()
        restarted = make()
        restarted.warmup()
        _instrument()
        rows = []
        for schema in schemas:
            _T.clear()
            start = time.perf_counter()
            restarted.compile_json_schema(schema)
            rows.append(_row(_T, time.perf_counter() - start))
        disk = restarted.cache_stats().disk
    out: dict[str, Any] = {**stamp(), "schemas": len(rows), "style": options["json_style"],
                           "spec_hits": disk.spec_hits if disk else None}
    for stage in rows[0]:
        values = [r[stage] for r in rows]
        out[stage] = {"p50": round(statistics.median(values), 4),
                      "mean": round(statistics.fmean(values), 4)}
    share = [r["llg_build"] / r["total"] for r in rows]
    out["llg_build_share_p50"] = round(statistics.median(share), 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
