"""JSON-Schema-Test-Suite (draft 2020-12) acceptance of grammarserve, per valid instance and per
walk, the figure of issue 16's first acceptance line.

The suite tests JSON Schema semantics, so the compiler runs with ``open_schemas=True`` (the
default closed mode narrows schemas on purpose, ``fsm/schema/close.py``). Each valid instance is walked
token by token (SmolLM2 tokenizer) in every form of the default JSON style (compact and
``json.dumps`` default: ``conformance.instance_texts``); each invalid instance in compact form.

- A *walk* is accepted when the matcher takes every token and terminates, with no value check
  failing. Documented refusals (keys in another order, ``1.0`` for an integer, asserted formats)
  count as misses; nothing is filtered out.
- A valid *instance* is accepted when every one of its walks is.
- An invalid instance is accepted when its walk is (must be 0). A refused schema accepts none.

Prints one JSON line (the figures, and the misses per cause with ``--misses`` on stderr):

    .venv/bin/python benchmarks/bench_suite.py [--suite DIR] [--misses] [--closed]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from machine import stamp

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SUITE = REPO / "tests" / "data" / "json-schema-test-suite" / "draft2020-12"


def measure(compiler: Any, tokenizer: Any, cases: list[Any]) -> tuple[dict[str, Any],
                                                                      list[str]]:
    """The figures over ``cases`` (``conformance.SuiteCase``) and one line per miss."""
    from grammarserve.errors import GrammarError
    from grammarserve.fsm.conformance import instance_texts, walk

    bitmask = compiler.allocate_bitmask(1)
    stop = compiler.stop_token_ids[0]
    c = Counter[str]()
    misses: list[str] = []
    for case in cases:
        c["schemas"] += 1
        try:
            grammar = compiler.compile_json_schema(case.schema)
            c["schemas_compiled"] += 1
            refusal = ""
        except GrammarError as e:
            grammar, refusal = None, f"schema refused: {e}"[:160]
        for desc, instance, valid in case.tests:
            texts = instance_texts(instance) if valid else instance_texts(instance)[:1]
            results = []
            for text in texts:
                ok, why = False, refusal
                if grammar is not None:
                    ids = tokenizer.encode(text, add_special_tokens=False)
                    ok, why = walk(grammar.matcher(), ids, stop, bitmask)
                results.append(ok)
                kind = "valid" if valid else "invalid"
                c[f"{kind}_walks"] += 1
                c[f"{kind}_walks_accepted"] += ok
                if valid and not ok:
                    misses.append(f"{case.file} | {case.description} | {desc} | {text!r}: "
                                  f"{why}")
                elif ok and not valid:
                    misses.append(f"INVALID ACCEPTED: {case.file} | {case.description} | "
                                  f"{desc} | {text!r}")
            kind = "valid" if valid else "invalid"
            c[f"{kind}_instances"] += 1
            c[f"{kind}_instances_accepted"] += all(results)
    figures: dict[str, Any] = dict(c)
    for kind in ("valid_instances", "valid_walks"):
        figures[f"{kind}_pct"] = round(100 * c[f"{kind}_accepted"] / max(1, c[kind]), 2)
    return figures, misses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default=str(DEFAULT_SUITE))
    parser.add_argument("--misses", action="store_true", help="list every miss on stderr")
    parser.add_argument("--closed", action="store_true",
                        help="the default closed-schema compiler instead (for reference: it "
                             "narrows schemas on purpose, fsm/closed.py)")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from transformers import AutoTokenizer

    from grammarserve.fsm import GrammarCompiler
    from grammarserve.fsm.conformance import load_suite
    from grammarserve.models.loader import resolve_model_folder

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_folder("default")))
    # NOTE: no compile timeout: a loaded machine must not turn a slow compile into a refusal.
    compiler = GrammarCompiler(tokenizer, open_schemas=not args.closed, compile_timeout_s=600,
                               background_upgrade=False)
    figures, misses = measure(compiler, tokenizer, list(load_suite(args.suite)))
    if args.misses:
        for line in misses:
            print(line, file=sys.stderr)
    print(json.dumps({**stamp(), "suite": Path(args.suite).name, "open_schemas": not args.closed,
                      **figures}))


if __name__ == "__main__":
    main()
