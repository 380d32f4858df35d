"""Cold JSON-schema compile, stage by stage, beside raw llguidance on the same schemas.

For every schema of a corpus that both compile: our front end (``GrammarCompiler.spec``: the
validated, rewritten schema), our backend step (``compile_spec_async``: the llguidance build of
both JSON styles, the start-mask probe, value checks), their sum, and raw llguidance's
``LLMatcher`` build of the schema as given (no first mask). Caches are cleared before each
schema. Prints one JSON line: p50/p90/p99 ms of each, and the ratios of ours to raw at p50 and
p99 (issue 37's targets: <= 1.5x and <= 2x).

    .venv/bin/python benchmarks/bench_grammar_stages.py [--corpora schemas,realworld,suite]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import stamp

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"schemas": REPO / "schemas", "realworld": REPO / "schemas" / "realworld",
           "suite": REPO / "tests" / "data" / "json-schema-test-suite" / "draft2020-12"}


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


def _stats(values: list[float]) -> dict[str, float]:
    return {"p50": _pct(values, 0.5), "p90": _pct(values, 0.9), "p99": _pct(values, 0.99)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", default="schemas,realworld,suite")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import llguidance
    import llguidance.hf
    from transformers import AutoTokenizer

    from grammarserve.fsm import GrammarCompiler
    from grammarserve.fsm.conformance import load_corpus, load_suite
    from grammarserve.models.loader import resolve_model_folder

    tok = AutoTokenizer.from_pretrained(str(resolve_model_folder("default")))
    ours = GrammarCompiler(tok, disk_cache_dir=None)
    ours.warmup()
    llt = llguidance.hf.from_tokenizer(tok, n_vocab=len(tok), eos_token=tok.eos_token_id)
    result: dict[str, Any] = {**stamp(), "bench": "grammar_stages", "corpora": {}}
    for corpus in args.corpora.split(","):
        cases = list((load_suite if corpus == "suite" else load_corpus)(FOLDERS[corpus]))
        rows: list[tuple[float, float, float]] = []
        for case in cases:
            ours.clear_caches()
            t0 = time.perf_counter()
            try:
                spec = ours.spec("json_schema", case.schema)
                t1 = time.perf_counter()
                ours.compile_spec_async(spec).result()
            except Exception:  # noqa: BLE001 - a refusal: not a schema both compile
                continue
            t2 = time.perf_counter()
            try:
                grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(case.schema))
                matcher = llguidance.LLMatcher(llt, grammar, log_level=0)
            except Exception:  # noqa: BLE001
                continue
            t3 = time.perf_counter()
            if matcher.is_error():
                continue
            rows.append(((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3))
        front, back, raw = ([r[i] for r in rows] for i in range(3))
        total = [f + b for f, b in zip(front, back)]
        block = {"schemas": len(cases), "both_compile": len(rows), "front_ms": _stats(front),
                 "backend_ms": _stats(back), "ours_ms": _stats(total), "raw_llguidance_ms":
                 _stats(raw)}
        block["ratio_p50"] = round(block["ours_ms"]["p50"] / block["raw_llguidance_ms"]["p50"], 2)
        block["ratio_p99"] = round(block["ours_ms"]["p99"] / block["raw_llguidance_ms"]["p99"], 2)
        result["corpora"][corpus] = block
        print(f"# {corpus}: {json.dumps(block)}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
