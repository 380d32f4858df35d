"""Grammar benchmark: grammarserve vs raw xgrammar vs raw llguidance per vocabulary (SmolLM2's
49k, Llama 3's 128k, Qwen2's 152k tokens: ``vocabularies.py``), per corpus: schemas/*.json
(hand-written), schemas/realworld/*.json (SchemaStore and check-jsonschema,
benchmarks/make_realworld_corpus.py) and the JSON-Schema-Test-Suite (draft 2020-12), plus all
of them together.

Prints one JSON line: per vocabulary, corpus and engine, compile p50/p99 (ms), per-token mask
p50/p99 (µs), schemas compiled/refused, valid instances accepted, invalid instances refused
(and accepted; those the tokenizer cannot spell, its tokens decoding to other text, are counted
apart, unwalked), and for ``grammarserve_cold`` the causes of each valid walk refused
(``fsm/exactness.py``: by cause and by kind: generation policy, backend limit, vocabulary,
unexplained); per vocabulary and corpus the ratios ``grammarserve_cold`` / raw llguidance
(``ratios``: over each engine's compiled schemas, and ``*_both`` over the schemas both
compile); then (on stderr) grammarserve's figures against the targets. Engines take turns
per schema.

- ``grammarserve_cold``: the first compile of each schema (compiled grammars and validated
  front-end results forgotten first, so meta-validation and the front end count), and every mask
  of every walk of it, the first matcher's included.
- ``grammarserve_steady``: the same schemas again once ``auto``'s background xgrammar upgrade is
  done: compile time is a cache hit (front end included), masks are those of later requests.

Valid instances are walked in the default style's forms (compact, ``json.dumps`` default),
invalid ones in compact form.

    .venv/bin/python benchmarks/bench_grammar.py [--vocab smollm2,llama3,qwen2]
        [--corpora schemas,realworld,suite]
        [--engines grammarserve_cold,grammarserve_steady,xgrammar,llguidance] [--limit N]
        [--compile-only]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import stamp
from vocabularies import load_tokenizer, parse_vocabularies

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SUITE = REPO / "tests" / "data" / "json-schema-test-suite" / "draft2020-12"
#: The grammar layer's latency targets, for cold and steady state alike.
TARGETS = {"compile_ms_p50": 2.0, "compile_ms_p99": 50.0, "mask_us_p50": 10.0,
           "mask_us_p99": 150.0}


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

    def take_retraction(self) -> bool:
        return False  # NOTE: a raw backend checks nothing after the grammar

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

    def grammarserve_cold(schema: Any) -> Callable[[], Any]:
        gs.clear_caches()
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

    return {"grammarserve_cold": grammarserve_cold, "grammarserve_steady": grammarserve_steady,
            "xgrammar": raw_xgrammar,
            "llguidance": raw_llguidance}


def _explainers(tok: Any) -> dict[str, Callable[[Any, Any, str], Any]]:
    """The causes of a refused valid walk, per grammarserve engine: its own compiler (the
    defaults, closed schemas) beside one with ``open_schemas=True``. Compiled with no
    background upgrade, so the grammar explained is the first requests' one."""
    from grammarserve.fsm import GrammarCompiler
    from grammarserve.fsm.conformance import explain_refusal

    closed = GrammarCompiler(tok, background_upgrade=False, compile_timeout_s=600)
    opened = GrammarCompiler(tok, background_upgrade=False, compile_timeout_s=600,
                             open_schemas=True)
    bitmask = closed.allocate_bitmask(1)

    def explain(schema: Any, instance: Any, form: str) -> Any:
        return explain_refusal(closed, schema, instance, form, tok, bitmask,
                               open_compiler=opened)

    # NOTE: not the steady engine's: its upgraded grammars are xgrammar's, not the explained ones
    return {"grammarserve_cold": explain}


class _Tally:
    """Compile times, mask times and walk counts of one engine over some schemas."""

    def __init__(self) -> None:
        self.compile_ms: list[float] = []
        self.compile_by_case: dict[tuple[str, str], float] = {}  # (file, description) -> ms
        self.masks_by_case: dict[tuple[str, str], list[float]] = {}  # -> its mask times (s)
        self.mask_s: list[float] = []
        self.c = {"schemas": 0, "compiled": 0, "refused": 0, "valid_accepted": 0,
                  "valid_total": 0, "valid_total_compiled": 0, "invalid_refused": 0, "invalid_accepted": 0,
                  "invalid_total": 0, "invalid_unspellable": 0}
        self.refusals: list[Any] = []  # exactness.Refusal of each valid walk refused
        self.explained = False  # whether refused valid walks were given their causes

    def add(self, other: _Tally) -> None:
        self.compile_ms += other.compile_ms
        self.compile_by_case.update(other.compile_by_case)
        self.masks_by_case.update(other.masks_by_case)
        self.mask_s += other.mask_s
        self.refusals += other.refusals
        self.explained = self.explained or other.explained
        for k, v in other.c.items():
            self.c[k] += v

    def summary(self) -> dict[str, Any]:
        def r(x: float | None, nd: int) -> float | None:
            return None if x is None else round(x, nd)

        from grammarserve.fsm.exactness import CauseKind, tally

        mask = self.mask_s
        kinds = {k.name.lower(): sum(1 for f in self.refusals if {c.kind for c in f.causes} == {k})
                 for k in CauseKind}  # NOTE: a walk with causes of two kinds counts in neither
        total = self.c["valid_total_compiled"] or 1
        rates = {"valid_accepted_rate": round(self.c["valid_accepted"] / total, 4)}
        exactness: dict[str, Any] = {}
        if self.explained:
            exactness = {"valid_refused_by_cause": tally(self.refusals),
                         "valid_refused_by_kind": kinds,
                         "valid_accepted_or_policy_rate": round(
                             (self.c["valid_accepted"] + kinds["policy"]) / total, 4)}
        return {"compile_ms_p50": r(_pct(self.compile_ms, 0.5), 3),
                "compile_ms_p99": r(_pct(self.compile_ms, 0.99), 3),
                "mask_us_p50": r((_pct(mask, 0.5) or 0) * 1e6, 2),
                "mask_us_p99": r((_pct(mask, 0.99) or 0) * 1e6, 1),
                "mask_us_mean": r(statistics.fmean(mask) * 1e6, 2) if mask else None,
                "masks": len(mask), **self.c, **rates, **exactness}


def _run(compile_fn: Callable[[Any], Any], cases: list[Any], tok: Any, stop: int,
         bitmask: torch.Tensor, encoded: dict[str, list[int]], walks: bool = True,
         explain: Callable[[Any, Any, str], Any] | None = None) -> _Tally:
    """Compile and walk ``cases``; ``explain(schema, instance, form)``: the causes of a valid
    walk refused (grammarserve's engines; see ``fsm/exactness.py``)."""
    from grammarserve.fsm.conformance import FORMS, instance_texts, walk
    from grammarserve.fsm.exactness import Refusal

    t = _Tally()
    t.explained = explain is not None
    for case in cases:
        t.c["schemas"] += 1
        masks: list[float] = []
        start = time.perf_counter()
        try:
            make = compile_fn(case.schema)
            elapsed = time.perf_counter() - start
            if isinstance(make, tuple):  # (matcher factory, its own compile time)
                make, elapsed = make
            t.compile_ms.append(elapsed * 1e3)
            t.compile_by_case[(case.file, case.description)] = elapsed * 1e3
            t.masks_by_case[(case.file, case.description)] = masks
            t.c["compiled"] += 1
        except Exception:  # noqa: BLE001 - a refusal counts as refused
            make = None
            t.c["refused"] += 1
        for _, instance, valid in case.tests if walks else []:
            texts = instance_texts(instance) if valid else instance_texts(instance)[:1]
            for form, text in zip(FORMS, texts):
                ok = False
                ids = encoded.setdefault(text, tok.encode(text, add_special_tokens=False))
                key = "valid" if valid else "invalid"
                t.c[f"{key}_total"] += 1
                if not valid and tok.decode(ids) != text:
                    # NOTE: the tokens write other text (Qwen2's tokenizer normalizes to NFC,
                    # so a + U+0308 becomes ä): no grammar is asked about this instance
                    t.c["invalid_unspellable"] += 1
                    continue
                if make is not None:
                    ok, _ = walk(make(), ids, stop, bitmask, mask_times=masks)
                t.c["valid_total_compiled"] += valid and make is not None
                if valid and ok:
                    t.c["valid_accepted"] += 1
                elif valid and make is not None and explain is not None:
                    t.refusals.append(Refusal(case.file, case.description, form,
                                              explain(case.schema, instance, form)))
                elif not valid:
                    t.c["invalid_accepted" if ok else "invalid_refused"] += 1
        t.mask_s += masks
    return t


def _ratios(ours: _Tally, raw: _Tally) -> dict[str, float | None]:
    """``ours`` / ``raw`` per latency figure, each over the schemas its engine compiled, and
    the same figures over the schemas both compiled (``*_both``; masks of the walks of those
    schemas)."""
    a, b = ours.summary(), raw.summary()
    both = sorted(set(ours.compile_by_case) & set(raw.compile_by_case))

    def div(x: float | None, y: float | None) -> float | None:
        return None if x is None or not y else round(x / y, 2)

    out = {k: div(a[k], b[k]) for k in TARGETS}
    for q, k in ((0.5, "compile_ms_p50_both"), (0.99, "compile_ms_p99_both")):
        out[k] = div(_pct([ours.compile_by_case[c] for c in both], q),
                     _pct([raw.compile_by_case[c] for c in both], q))
    for q, k in ((0.5, "mask_us_p50_both"), (0.99, "mask_us_p99_both")):
        out[k] = div(_pct([m for c in both for m in ours.masks_by_case[c]], q),
                     _pct([m for c in both for m in raw.masks_by_case[c]], q))
    out["both_compiled"] = len(both)
    return out


def _report(vocab: str, result: dict[str, Any]) -> None:
    """grammarserve's figures against the targets, one line per corpus and engine."""
    print("# targets: " + ", ".join(f"{k} <= {v}" for k, v in TARGETS.items()), file=sys.stderr)
    for corpus, block in result["corpora"].items():
        for name in ("grammarserve_cold", "grammarserve_steady"):
            s = block["engines"].get(name)
            if s is None:
                continue
            cells = []
            for k, limit in TARGETS.items():
                v = s[k]
                mark = "n/a" if v is None else ("ok" if v <= limit else "MISSED")
                cells.append(f"{k} {v} ({mark})")
            print(f"# {vocab} {corpus} {name}: " + "; ".join(cells) + f"; invalid accepted "
                  f"{s['invalid_accepted']}", file=sys.stderr)
        if "ratios" in block:
            print(f"# {vocab} {corpus} ours / llguidance: {json.dumps(block['ratios'])}",
                  file=sys.stderr)


def _run_vocabulary(vocab: str, tok: Any, corpora: dict[str, list[Any]], engine_names: list[str],
                    walks: bool) -> dict[str, Any]:
    """Every engine over every corpus on one tokenizer: ``{"tokens", "corpora"}``, each corpus
    ``{"schemas", "engines", "ratios"}`` (ratios when both grammarserve_cold and llguidance
    ran), plus ``"all"`` when there are several corpora."""
    engines = _engines(tok)
    explainers = _explainers(tok)
    stop = int(tok.eos_token_id)
    bitmask = torch.zeros((1, (len(tok) + 31) // 32), dtype=torch.int32)
    encoded: dict[str, list[int]] = {}  # text -> token ids, shared by all engines
    out: dict[str, Any] = {"tokens": len(tok), "corpora": {}}
    totals: dict[str, _Tally] = {}
    blocks: list[tuple[dict[str, Any], dict[str, _Tally]]] = []
    for corpus, cases in corpora.items():
        block: dict[str, Any] = {"schemas": len(cases), "engines": {}}
        tallies = {name: _Tally() for name in engine_names}
        # NOTE: engines take turns per schema, so a load change on a shared machine falls on
        # all of them alike, not on one engine's whole pass (the ratios stay comparable)
        for case in cases:
            for name in engine_names:
                tallies[name].add(_run(engines[name], [case], tok, stop, bitmask, encoded,
                                       walks=walks, explain=explainers.get(name)))
        for name in engine_names:
            totals.setdefault(name, _Tally()).add(tallies[name])
            block["engines"][name] = tallies[name].summary()
            print(f"# {vocab} {corpus} {name}: {json.dumps(block['engines'][name])}",
                  file=sys.stderr)
        out["corpora"][corpus] = block
        blocks.append((block, tallies))
    if len(corpora) > 1:
        block = {"schemas": sum(len(c) for c in corpora.values()),
                 "engines": {n: t.summary() for n, t in totals.items()}}
        out["corpora"]["all"] = block
        blocks.append((block, totals))
    for block, tallies in blocks:
        if "grammarserve_cold" in tallies and "llguidance" in tallies:
            block["ratios"] = _ratios(tallies["grammarserve_cold"], tallies["llguidance"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", default="smollm2",
                        help="comma-separated vocabularies: smollm2 (49k), llama3 (128k), "
                             "qwen2 (152k); see vocabularies.py")
    parser.add_argument("--suite", default=str(DEFAULT_SUITE))
    parser.add_argument("--schemas", default=str(REPO / "schemas"))
    parser.add_argument("--realworld", default=str(REPO / "schemas" / "realworld"))
    parser.add_argument("--corpora", default="schemas,realworld,suite")
    parser.add_argument("--engines",
                        default="grammarserve_cold,grammarserve_steady,xgrammar,llguidance")
    parser.add_argument("--limit", type=int, default=0, help="max schemas per corpus (0 = all)")
    parser.add_argument("--compile-only", action="store_true",
                        help="no walks between compiles (compile times alone; no masks)")
    args = parser.parse_args()
    vocabs = parse_vocabularies(args.vocab)
    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from grammarserve.fsm.conformance import load_corpus, load_suite

    loaders = {"schemas": lambda: load_corpus(args.schemas),
               "realworld": lambda: load_corpus(args.realworld),
               "suite": lambda: load_suite(args.suite)}
    folders = {"schemas": args.schemas, "realworld": args.realworld, "suite": args.suite}
    corpora = {}
    for name in args.corpora.split(","):
        if Path(folders[name]).is_dir():
            cases = list(loaders[name]())
            corpora[name] = cases[:args.limit] if args.limit else cases
    result: dict[str, Any] = {**stamp(), "targets": TARGETS, "limit": args.limit,
                              "ratio": "grammarserve_cold / llguidance", "vocabularies": {}}
    for vocab in vocabs:
        tok = load_tokenizer(vocab)
        block = _run_vocabulary(vocab, tok, corpora, args.engines.split(","),
                                walks=not args.compile_only)
        result["vocabularies"][vocab] = block
        _report(vocab, block)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
