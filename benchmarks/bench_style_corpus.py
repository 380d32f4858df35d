"""Which replies of the schema corpus run into ``max_tokens``, per engine ``json_style``.

The prompts of ``tests/test_constrained.py`` (each schema's description and first valid
instance, ``json.dumps`` default, as the example), greedy, ``max_tokens`` 384, one batch per
style, over the schemas named by ``--schemas`` (default: all of ``schemas/``). Prints one JSON
line: per style, the number cut and their names; ``-v`` adds each reply's start on stderr.

    .venv/bin/python benchmarks/bench_style_corpus.py --styles compact,spaced,auto
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from machine import stamp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--styles", default="compact,spaced,auto")
    ap.add_argument("--schemas", default="", help="comma-separated names (default: all)")
    ap.add_argument("-v", action="store_true")
    args = ap.parse_args()
    import test_constrained as tc

    from grammarserve.config import EngineConfig
    from grammarserve.engine.engine import Engine
    from grammarserve.llm import LLM
    from grammarserve.models.loader import load_model

    names = args.schemas.split(",") if args.schemas else tc.NAMES
    items = [tc._load(n) for n in names]
    loaded = load_model("default")
    base = EngineConfig(device="cpu", kv_cache_tokens=32768, max_num_reqs=len(names),
                        max_batch_tokens=4096)
    out: dict[str, dict[str, object]] = {}
    for style in args.styles.split(","):
        llm = LLM.from_engine(Engine(dataclasses.replace(base, grammar_json_style=style),
                                     loaded=loaded))
        replies = llm.generate([tc._prompt(llm, it) for it in items],
                               [tc._params(it) for it in items])
        cut = [n for n, o in zip(names, replies) if o.finish_reason == "length"]
        out[style] = {"cut": len(cut), "of": len(names), "cut_names": cut}
        if args.v:
            for n, o in zip(names, replies):
                print(style, n, o.finish_reason, repr(o.text[:120]), file=sys.stderr)
    print(json.dumps({**stamp(), "bench": "style_corpus", "max_tokens": tc.MAX_TOKENS, "styles": out}))


if __name__ == "__main__":
    main()
