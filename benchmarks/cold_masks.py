"""Where the slow masks of a cold run come from (issue 16 item 3: mask p99 <= 150 µs).

Runs ``bench_grammar.py``'s ``grammarserve_cold`` engine over one corpus (each schema compiled
cold, then every instance walked) and sorts every mask over the threshold by the backend that
served the walk, by whether it was the schema's first walk or a later one, and by how many
tokens the mask allows (a trie walk over most of the vocabulary, or parser/lexer work with few
tokens allowed). Prints one JSON line.

    python benchmarks/cold_masks.py [--corpus realworld|schemas|suite] [--threshold-us 150]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_grammar
from machine import stamp


def _size_class(allowed: int) -> str:
    return "most (>40k)" if allowed > 40_000 else "some (1k-40k)" if allowed > 1000 else "few"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="realworld", choices=["realworld", "schemas", "suite"])
    parser.add_argument("--threshold-us", type=float, default=150.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from transformers import AutoTokenizer

    from grammarserve.fsm.conformance import bit, instance_texts, load_corpus, load_suite
    from grammarserve.models.loader import resolve_model_folder

    tok = AutoTokenizer.from_pretrained(str(resolve_model_folder("default")))
    repo = bench_grammar.REPO
    folder = repo / "schemas" / "realworld" if args.corpus == "realworld" else repo / "schemas"
    cases = (list(load_suite(str(bench_grammar.DEFAULT_SUITE))) if args.corpus == "suite"
             else list(load_corpus(folder)))
    cold = bench_grammar._engines(tok)["grammarserve_cold"]
    stop = int(tok.eos_token_id)
    bitmask = torch.zeros((1, (len(tok) + 31) // 32), dtype=torch.int32)
    limit = args.threshold_us * 1e-6
    masks: Counter[str] = Counter()
    slow: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    by_schema: Counter[str] = Counter()
    for case in cases:
        try:
            make = cold(case.schema)
        except Exception:  # noqa: BLE001 - refused: no masks
            make = None
        if make is None:
            continue
        grammar = make.__self__
        walks = 0
        for _, instance, valid in case.tests:
            for text in instance_texts(instance) if valid else instance_texts(instance)[:1]:
                matcher = make()  # NOTE: its backend: the upgrade may land between walks
                key = f"{grammar.backend}, {'later' if walks else 'first'} walk"
                walks += 1
                for token in tok.encode(text, add_special_tokens=False) + [stop]:
                    start = time.perf_counter()
                    matcher.fill_bitmask(bitmask, 0)
                    took = time.perf_counter() - start
                    masks[key] += 1
                    if took > limit:
                        slow[key] += 1
                        allowed = int(np.unpackbits(bitmask[0].numpy().view(np.uint8)).sum())
                        kinds[_size_class(allowed)] += 1
                        by_schema[case.file] += 1
                    if not bit(bitmask, 0, token) or not matcher.accept_token(token):
                        break
    keys = sorted(masks)
    total = sum(masks.values())
    print(json.dumps({
        **stamp(), "corpus": args.corpus, "threshold_us": args.threshold_us,
        "masks": total, "slow": sum(slow.values()),
        "slow_share": round(sum(slow.values()) / max(total, 1), 4),
        "by_walk": {k: {"masks": masks[k], "slow": slow[k]} for k in keys},
        "slow_by_tokens_allowed": dict(kinds),
        "slowest_schemas": dict(by_schema.most_common(10))}))


if __name__ == "__main__":
    main()
