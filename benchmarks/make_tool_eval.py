"""Build ``benchmarks/data/tool_eval.jsonl`` from the BFCL data in the ``bfcl-eval`` wheel.

    python3 -m pip download --no-deps bfcl-eval==2026.3.23 -d /tmp/bfcl
    cd /tmp/bfcl && unzip -q bfcl_eval-2026.3.23-py3-none-any.whl -d x
    .venv/bin/python benchmarks/make_tool_eval.py --bfcl-data /tmp/bfcl/x/bfcl_eval/data

Selection is by position only (never by any model's answers): from each of the four files,
``PER_FILE`` questions at every k-th line, k = lines // PER_FILE, starting with the first.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tool_eval import renamed_answer, renamed_function, to_openai_tool

PER_FILE = 16
FILES = {"simple": "BFCL_v4_simple_python.json", "multiple": "BFCL_v4_multiple.json",
         "parallel": "BFCL_v4_parallel.json",
         "parallel_multiple": "BFCL_v4_parallel_multiple.json"}
OUT = Path(__file__).resolve().parent / "data" / "tool_eval.jsonl"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def build(data: Path, per_file: int = PER_FILE) -> list[dict]:
    rows = []
    for category, name in FILES.items():
        questions = _lines(data / name)
        answers = {a["id"]: a["ground_truth"] for a in _lines(data / "possible_answer" / name)}
        step = len(questions) // per_file
        for q in questions[::step][:per_file]:
            assert len(q["question"]) == 1, "single-turn categories only"
            rows.append({
                "id": q["id"], "category": category, "source": name,
                "messages": q["question"][0],
                "tools": [to_openai_tool(fn) for fn in q["function"]],
                "functions": [renamed_function(fn) for fn in q["function"]],
                "ground_truth": renamed_answer(answers[q["id"]]),
            })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bfcl-data", type=Path, required=True,
                    help="the wheel's bfcl_eval/data folder")
    ap.add_argument("--per-file", type=int, default=PER_FILE)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    rows = build(args.bfcl_data, args.per_file)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{len(rows)} questions -> {args.out}")


if __name__ == "__main__":
    main()
