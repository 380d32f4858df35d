"""What a full garbage collection costs in a process holding the engine, before and after
``freeze_startup_heap`` (what the engine process, ``grammarserve batch`` and the Ray batch actor
do once the engine is built). A full collection walks every tracked object; in the engine
process it stalls every request in the batch. Prints one JSON line.

    .venv/bin/python benchmarks/bench_gc.py [--model default] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import stamp


def _full_collection_ms(repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(times), 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from grammarserve import EngineConfig
    from grammarserve.engine.engine import Engine
    from grammarserve.engine.heap import freeze_startup_heap

    engine = Engine(EngineConfig(model=args.model))
    tracked = len(gc.get_objects())
    before = _full_collection_ms(args.repeat)
    frozen = freeze_startup_heap()
    after = _full_collection_ms(args.repeat)
    print(json.dumps({**stamp(), "bench": "gc", "model": args.model,
                      "kv_capacity": engine.runner.pool.capacity, "tracked_objects": tracked,
                      "frozen_objects": frozen, "full_collection_ms_before": before,
                      "full_collection_ms_after": after}))


if __name__ == "__main__":
    main()
