"""Which grammar-backend calls hold the GIL: each call runs once alone and once beside a Python
thread that sleeps 1 ms in a loop; a call that releases the GIL lets that thread wake about
once a millisecond, one that holds it leaves one long gap (the call's whole length).

Calls: llguidance's grammar build (``LLMatcher(...)``) and one mask, xgrammar's ahead-of-time
compile (what ``auto``'s background upgrade runs) and its lazy compile, each on a schema of
``schemas/realworld/`` as the front end prepares it. Prints one JSON line::

    .venv/bin/python benchmarks/bench_gil.py [--schema semgrep] [--xgrammar-schema typings]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import stamp

REPO = Path(__file__).resolve().parents[1]


def _beside_sleeper(call: Callable[[], Any]) -> dict[str, float]:
    """``call``'s time alone and beside a 1 ms sleep loop, with the loop's wakeups and its
    longest gap during the call."""
    start = time.perf_counter()
    call()
    alone = time.perf_counter() - start
    gaps: list[float] = []
    stop = threading.Event()

    def sleeper() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            time.sleep(0.001)
            gaps.append(time.perf_counter() - t)

    thread = threading.Thread(target=sleeper)
    thread.start()
    time.sleep(0.02)
    gaps.clear()
    start = time.perf_counter()
    call()
    beside = time.perf_counter() - start
    stop.set()
    thread.join()
    return {"alone_ms": round(alone * 1e3, 2), "beside_ms": round(beside * 1e3, 2),
            "sleeper_wakeups": len(gaps),
            "sleeper_longest_gap_ms": round(max(gaps, default=0.0) * 1e3, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--schema", default="semgrep", help="schemas/realworld/<name>.json")
    ap.add_argument("--xgrammar-schema", default="typings",
                    help="a schema in xgrammar's exact subset, for its compiles")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from grammarserve.fsm import GrammarCompiler
    from grammarserve.models.loader import resolve_model_folder

    tok = AutoTokenizer.from_pretrained(str(resolve_model_folder("default")))
    gs = GrammarCompiler(tok, background_upgrade=False)
    gs.warmup()

    def spec(name: str) -> Any:
        doc = json.loads((REPO / "schemas" / "realworld" / f"{name}.json").read_text())
        return gs.front.json_spec(doc["schema"]).with_option("json_style", "compact")

    import llguidance

    llg = gs.policy.backend("llguidance")
    text = llg.grammar_text(spec(args.schema))
    matcher = llguidance.LLMatcher(llg._tok, text, log_level=0)
    bitmask = torch.zeros(gs.vocab.bitmask_width, dtype=torch.int32)
    xgb = gs.policy.backend("xgrammar")
    xspec = spec(args.xgrammar_schema)
    out: dict[str, Any] = {"bench": "gil", "schema": args.schema,
                           "xgrammar_schema": args.xgrammar_schema}
    out["llguidance_build"] = _beside_sleeper(
        lambda: llguidance.LLMatcher(llg._tok, text, log_level=0))
    out["llguidance_mask"] = _beside_sleeper(
        lambda: matcher.deep_copy().unsafe_compute_mask_ptr(bitmask.data_ptr(),
                                                            bitmask.numel() * 4))
    out["xgrammar_ahead_of_time"] = _beside_sleeper(lambda: xgb.compile(xspec, background=True))
    out["xgrammar_lazy"] = _beside_sleeper(lambda: xgb.compile(xspec))
    print(json.dumps({**stamp(), **out}))


if __name__ == "__main__":
    main()
