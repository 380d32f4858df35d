"""A decode step of this working tree against the tree at git revision ``--base``, the two run
alternately in fresh processes (a noisy host hurts both alike).

Each process loads the embedded model from its own tree (``git archive`` of ``--base`` into a
temporary folder, put first on ``PYTHONPATH``; the kernels' package ``grammarserve_kernels`` is
linked to that tree's ``kernels/``), prefills ``--rows`` random ``--context``-token prompts, then
times ``--windows`` windows of ``--steps`` decode steps and keeps the quickest window; with the
decode-stack kernel, also its own split (matmul, attention, K/V writes, rest). Prints one JSON
line: per tree the best step of each process and their median.

    .venv/bin/python benchmarks/ab_decode_step.py --base HEAD~5 [--rows 8] [--pairs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import stamp

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
from grammarserve import LLM, SamplingParams
rows, ctx, steps, windows = (int(a) for a in sys.argv[2:6])
llm = LLM("default", device="cpu", max_num_reqs=rows, enable_prefix_cache=False,
          kv_cache_tokens=rows * (ctx + steps * windows + 64) + 4096,
          decode_mirror_tokens=rows * (ctx + steps * windows + 64))
eng = llm.engine
gen = torch.Generator().manual_seed(rows)
for i in range(rows):
    ids = torch.randint(100, 40000, (ctx,), generator=gen).tolist()
    eng.add_request(f"r{i}", ids, SamplingParams(max_tokens=steps * windows + 8, temperature=0,
                                                 ignore_eos=True))
while any(not r.output_ids for r in eng.requests.values()):
    eng.step()
stack = eng.loaded.model.decode_stack
best = None
for _ in range(windows):
    before = dict(stack.seconds) if stack is not None else {}
    t0 = time.perf_counter()
    for _ in range(steps):
        eng.step()
    ms = (time.perf_counter() - t0) / steps * 1e3
    after = dict(stack.seconds) if stack is not None else {}
    if best is None or ms < best["step_ms"]:
        best = {"step_ms": round(ms, 2),
                **{k + "_ms": round((after[k] - before[k]) / steps * 1e3, 2) for k in after}}
print(json.dumps(best))
"""


def _tree(rev: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / "grammarserve_kernels").symlink_to(into / "kernels")
    return into


def _run(tree: Path | None, args: argparse.Namespace) -> dict[str, float]:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", _CHILD, str(args.threads), str(args.rows),
                          str(args.context), str(args.steps), str(args.windows)],
                         env=env, cwd=tempfile.gettempdir(), check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision to compare with")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"base": [], "work": []}
    with tempfile.TemporaryDirectory() as tmp:
        base = _tree(args.base, Path(tmp))
        for i in range(args.pairs):
            for name in (("base", "work") if i % 2 == 0 else ("work", "base")):
                runs[name].append(_run(base if name == "base" else None, args))
    print(json.dumps({**stamp(), "bench": "ab_decode_step", "base": args.base, "rows": args.rows,
                      "context": args.context, "runs": runs,
                      **{f"{k}_median_step_ms": round(statistics.median(
                          r["step_ms"] for r in v), 2) for k, v in runs.items()}}))


if __name__ == "__main__":
    main()
