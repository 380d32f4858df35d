"""Grammar benchmark: grammarserve vs raw xgrammar vs raw llguidance on the embedded model's
tokenizer, over schemas/*.json (if present) and the JSON-Schema-Test-Suite (draft 2020-12).

Prints one JSON line: per engine, compile p50/p99 (ms), per-token mask p50/p99 (µs), schemas
compiled/refused, valid instances accepted, invalid instances refused (and accepted).
``grammarserve`` is a cold compile (cache cleared) and the first requests' masks;
``grammarserve_steady`` is the same schemas again once ``auto``'s background xgrammar upgrade
is done (its compile time is then a cache hit, front end included). Valid instances are walked in three forms
(compact, ``json.dumps`` default, ``indent=2``), invalid ones in compact form.

    .venv/bin/python benchmarks/bench_grammar.py [--suite DIR] [--schemas DIR] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SUITE = REPO / "tests" / "data" / "json-schema-test-suite" / "draft2020-12"


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


class _Raw:
    """Adapts a raw backend matcher to the (fill_bitmask, accept_token) walk protocol."""

    def __init__(self, fill: Callable[[torch.Tensor], Any], accept: Callable[[int], Any],
                 stop: int) -> None:
        self.fill, self.accept, self.stop, self.done = fill, accept, stop, False

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self.fill(bitmask[row:row + 1])

    def accept_token(self, token: int) -> bool:
        ok = bool(self.accept(token))
        self.done = ok and token == self.stop
        return ok

    def is_terminated(self) -> bool:
        return self.done

    def error(self) -> str:
        return ""


def _engines(tok: Any) -> dict[str, Callable[[Any], Any]]:
    import llguidance
    import llguidance.hf
    import xgrammar as xgr

    from grammarserve.fsm import GrammarCompiler

    stop = int(tok.eos_token_id)
    gs = GrammarCompiler(tok)
    gs.warmup()
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok), stop_token_ids=[stop])
    xc = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
    llt = llguidance.hf.from_tokenizer(tok, n_vocab=len(tok), eos_token=stop)

    def grammarserve(schema: Any) -> Callable[[], Any]:
        gs.cache.clear()
        return gs.compile_json_schema(schema).matcher

    def grammarserve_steady(schema: Any) -> tuple[Callable[[], Any], float]:
        # NOTE: the same schema again, after auto's background upgrade (if any) finished:
        # the state of every request after the first ones. Its compile time is a cache hit.
        upgrade = gs.compile_json_schema(schema).request_upgrade()
        if upgrade is not None:
            upgrade.result()
        start = time.perf_counter()
        grammar = gs.compile_json_schema(schema)
        return grammar.matcher, time.perf_counter() - start

    def raw_xgrammar(schema: Any) -> Callable[[], Any]:
        compiled = xc.compile_json_schema(json.dumps(schema))

        def make() -> _Raw:
            m = xgr.GrammarMatcher(compiled)
            return _Raw(lambda row: m.fill_next_token_bitmask(row, 0), m.accept_token, stop)
        return make

    def raw_llguidance(schema: Any) -> Callable[[], Any]:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        proto = llguidance.LLMatcher(llt, grammar, log_level=0)
        if proto.is_error():
            raise ValueError(proto.get_error())

        def make() -> _Raw:
            m = proto.deep_copy()
            return _Raw(lambda row: m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4),
                        m.consume_token, stop)
        return make

    return {"grammarserve": grammarserve, "grammarserve_steady": grammarserve_steady,
            "xgrammar": raw_xgrammar,
            "llguidance": raw_llguidance}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default=str(DEFAULT_SUITE))
    parser.add_argument("--schemas", default=str(REPO / "schemas"))
    parser.add_argument("--limit", type=int, default=0, help="max schemas (0 = all)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from transformers import AutoTokenizer

    from grammarserve.fsm.conformance import instance_texts, load_corpus, load_suite, walk
    from grammarserve.models.loader import resolve_model_folder

    tok = AutoTokenizer.from_pretrained(str(resolve_model_folder("default")))
    cases = list(load_corpus(args.schemas)) if Path(args.schemas).is_dir() else []
    n_corpus = len(cases)
    cases += list(load_suite(args.suite)) if Path(args.suite).is_dir() else []
    if args.limit:
        cases = cases[:args.limit]
        n_corpus = min(n_corpus, len(cases))
    engines = _engines(tok)
    stop = int(tok.eos_token_id)
    bitmask = torch.zeros((1, (len(tok) + 31) // 32), dtype=torch.int32)
    encoded: dict[str, list[int]] = {}  # text -> token ids, shared by all engines
    result: dict[str, Any] = {"schemas": len(cases), "corpus_schemas": n_corpus,
                              "suite_schemas": len(cases) - n_corpus, "engines": {}}
    for name, compile_fn in engines.items():
        compile_ms: list[float] = []
        mask_s: list[float] = []
        c = {"compiled": 0, "refused": 0, "valid_accepted": 0, "valid_total": 0,
             "invalid_refused": 0, "invalid_accepted": 0, "invalid_total": 0}
        for case in cases:
            start = time.perf_counter()
            try:
                make = compile_fn(case.schema)
                elapsed = time.perf_counter() - start
                if isinstance(make, tuple):  # (matcher factory, its own compile time)
                    make, elapsed = make
                compile_ms.append(elapsed * 1e3)
                c["compiled"] += 1
            except Exception:  # noqa: BLE001 - a refusal counts as refused
                make = None
                c["refused"] += 1
            for _, instance, valid in case.tests:
                texts = instance_texts(instance) if valid else instance_texts(instance)[:1]
                for text in texts:
                    ok = False
                    if make is not None:
                        ids = encoded.setdefault(text, tok.encode(text, add_special_tokens=False))
                        ok, _ = walk(make(), ids, stop, bitmask, mask_times=mask_s)
                    key = "valid" if valid else "invalid"
                    c[f"{key}_total"] += 1
                    if valid and ok:
                        c["valid_accepted"] += 1
                    elif not valid:
                        c["invalid_accepted" if ok else "invalid_refused"] += 1
        result["engines"][name] = {
            "compile_ms_p50": _pct(compile_ms, 0.5), "compile_ms_p99": _pct(compile_ms, 0.99),
            "mask_us_p50": (_pct(mask_s, 0.5) or 0) * 1e6,
            "mask_us_p99": (_pct(mask_s, 0.99) or 0) * 1e6,
            "mask_us_mean": statistics.fmean(mask_s) * 1e6 if mask_s else None,
            "masks": len(mask_s), **c}
        print(f"# {name}: {json.dumps(result['engines'][name])}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
