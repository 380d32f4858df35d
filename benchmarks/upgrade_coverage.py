"""Which schemas ``auto`` hands to xgrammar when they are reused, and why the others stay with
llguidance (the first keyword xgrammar's exact subset refuses, or slow masks). No timing.

    python benchmarks/upgrade_coverage.py [--corpora schemas,realworld]

Prints one JSON line: per corpus, the schemas the front end takes, how many xgrammar gets, and
the reasons for the rest.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import stamp

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", default="schemas,realworld")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from grammarserve.errors import GrammarError
    from grammarserve.fsm import GrammarCompiler
    from grammarserve.fsm.backends.xgrammar_subset import xgrammar_schema
    from grammarserve.fsm.conformance import load_corpus
    from grammarserve.models.loader import resolve_model_folder

    tok = AutoTokenizer.from_pretrained(str(resolve_model_folder("default")))
    compiler = GrammarCompiler(tok)
    xgrammar = compiler.policy.backend("xgrammar")
    folders = {"schemas": REPO / "schemas", "realworld": REPO / "schemas" / "realworld"}
    result: dict[str, object] = {**stamp()}
    for corpus in args.corpora.split(","):
        why: Counter[str] = Counter()
        taken = 0
        for case in load_corpus(folders[corpus]):
            try:
                spec = compiler.spec("json_schema", case.schema)
            except GrammarError:
                continue
            taken += 1
            compact = spec.with_option("json_style", "compact")
            if not xgrammar.accepts(compact):
                try:
                    xgrammar_schema(json.loads(compact.source))
                    why["too large"] += 1
                except GrammarError as e:
                    why[f"keyword {getattr(e, 'keyword', None)}"] += 1
            elif not xgrammar.upgrade_pays(compact):
                why["slow masks (slow_masks_at)"] += 1
            else:
                why["xgrammar"] += 1
        result[corpus] = {"schemas": taken, "to_xgrammar": why.pop("xgrammar", 0),
                          "stay_with_llguidance": dict(why.most_common())}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
