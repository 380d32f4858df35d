"""A test model for tool sets past the embedded model's 8k context (issue 34, item 5): the
SmolLM2-135M shapes and tokenizer (the embedded model's config.json and tokenizer files) with
``max_position_embeddings`` 32768 and ``rope_theta`` raised from 1e5 to 1e6, seeded random
weights (``random_models.write_random_folder``: fp32 safetensors, ~540 MB; not committed).
Its replies mean nothing; the grammar still makes every tool call valid.

    .venv/bin/python benchmarks/make_long_context_model.py /tmp/smollm2-32k-random
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from random_models import write_random_folder

from grammarserve.models.loader import resolve_model_folder

CONTEXT = 32768
ROPE_THETA = 1_000_000.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    src = resolve_model_folder("default")
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(max_position_embeddings=CONTEXT, rope_theta=ROPE_THETA)
    write_random_folder(args.folder, cfg, src, seed=args.seed)
    tok_cfg = args.folder / "tokenizer_config.json"
    if tok_cfg.is_file():  # the tokenizer's own limit (8192) would warn on every long prompt
        data = json.loads(tok_cfg.read_text())
        data["model_max_length"] = CONTEXT
        tok_cfg.write_text(json.dumps(data, indent=1))
    print(args.folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
