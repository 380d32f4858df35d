"""README's headline table, rendered from committed raw result lines (never typed by hand).

    .venv/bin/python benchmarks/headline.py --prefix benchmarks/peers/results-DATE-headline
    .venv/bin/python benchmarks/headline.py --prefix ... --write   # replace it in README.md
    .venv/bin/python benchmarks/headline.py --prefix ... --check   # exit 1 if README.md differs

The prefix names one run's files: ``PREFIX-quality.jsonl`` (``bench_quality.py``),
``-serving.jsonl`` (``bench_serving.py --workload extraction``, two rounds), ``-clients.jsonl``
(``bench_clients.py --cold``), ``-batch.jsonl`` (``peers/batch_side_by_side.py``, zero-shot and
no_json) and, if present, ``-spec.jsonl`` (``bench_spec.py --parts single``); for each server
and workload the last line wins. The table goes between the ``<!-- headline:begin -->`` and
``<!-- headline:end -->`` lines of README.md. Its caption names the revisions the lines record,
the CPU and the time span; ``--strict`` exits 1 unless the code at HEAD (``grammarserve/``,
``kernels/``) is the code they measured (a line from a dirty tree cannot be checked: it fails).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"
CODE = ("grammarserve", "kernels")  # what a measurement depends on


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] \
        if path.exists() else []


def _rev(line: dict[str, Any]) -> str:
    return str(line.get("git") or line.get("revision") or "unknown")


def same_code(rev: str) -> bool:
    """Whether ``rev`` (a ``git describe --dirty`` string) measured the code HEAD holds."""
    if rev.endswith("-dirty") or rev == "unknown":
        return False
    commit = rev.rsplit("-g", 1)[-1]
    return subprocess.run(["git", "diff", "--quiet", commit, "HEAD", "--", *CODE], cwd=ROOT,
                          capture_output=True).returncode == 0


def _cells(quality: dict[str, Any]) -> tuple[int, int, int]:
    """Cells (shape x prompt style) below vLLM's (fewer valid, or field accuracy more than one
    point lower), above it, and in all."""
    ours, peer = quality["targets"]["default"]["cells"], quality["targets"]["vllm"]["cells"]
    below = above = 0
    for name, a in ours.items():
        b = peer[name]
        if a["valid"] < b["valid"] or a["field_acc"] < b["field_acc"] - 0.01:
            below += 1
        elif a["valid"] > b["valid"] or a["field_acc"] > b["field_acc"] + 0.01:
            above += 1
    return below, above, len(ours)


def rows(prefix: Path) -> tuple[list[tuple[str, str, str]], list[dict[str, Any]]]:
    """The table's rows (workload, ours, vLLM's) and the lines they come from."""
    used: list[dict[str, Any]] = []
    out: list[tuple[str, str, str]] = []
    q = _lines(Path(f"{prefix}-quality.jsonl"))
    if q:
        line = q[-1]
        used.append(line)
        t = line["targets"]
        a, v = t["default"]["total"], t["vllm"]["total"]
        n = a["n"]
        out.append((f"quality matrix, {line['docs']} documents per cell (`bench_quality.py`): "
                    f"finished valid, of {n}", f"**{a['valid']}**", str(v["valid"])))
        out.append(("same: field accuracy against the documents' truth",
                    f"**{100 * a['field_acc']:.1f}%**", f"{100 * v['field_acc']:.1f}%"))
        extra = ""
        if "nospec" in t:
            extra = f"; {t['nospec']['total']['goodput_valid_per_s']:.2f} without speculation"
        out.append(("same: goodput, valid replies/s",
                    f"**{a['goodput_valid_per_s']:.2f}** "
                    f"({a['goodput_valid_per_s'] / v['goodput_valid_per_s']:.2f}x{extra})",
                    f"{v['goodput_valid_per_s']:.2f}"))
        below, above, cells = _cells(line)
        out.append(("same: cells below vLLM (valid, or accuracy by more than a point)",
                    f"{below} of {cells} ({above} above)", ""))
    s = _lines(Path(f"{prefix}-serving.jsonl"))
    if s:
        ours = [x for x in s if x["server"] == "grammarserve"]
        peer = [x for x in s if x["server"] == "vllm"]
        used += ours + peer
        fmt = " / ".join(f"{x['goodput_valid_per_s']:.2f}" for x in ours)
        pfmt = " / ".join(f"{x['goodput_valid_per_s']:.2f}" for x in peer)
        out.append((f"flat few-shot JSON extraction (`bench_serving.py --workload extraction`, "
                    f"{ours[0]['requests']} requests, {len(ours)} rounds): valid / goodput",
                    f"{ours[-1]['valid_replies']}/{ours[-1]['requests']}, **{fmt}** valid/s",
                    f"{peer[-1]['valid_replies']}/{peer[-1]['requests']}, {pfmt}" if peer else ""))
    c = _lines(Path(f"{prefix}-clients.jsonl"))
    if c:
        by = {x["label"]: x for x in c}
        used += list(by.values())
        g, v = by.get("grammarserve"), by.get("vllm")
        out.append(("nested Pydantic `Invoice` through the client paths (`bench_clients.py "
                    "--cold`): objects parsed",
                    f"**{g['parsed']}/{g['of']}**" if g else "", f"{v['parsed']}/{v['of']}" if v else ""))
    for line in _lines(Path(f"{prefix}-batch.jsonl")):
        used.append(line)
        g, v = line["grammarserve"], line["vllm"]
        out.append((f"batch job, {line['lines']} `{line['workload']}` lines, prompt style "
                    f"`{line['prompt_style']}` (`peers/batch_side_by_side.py`): valid lines, field "
                    "accuracy, valid lines/s",
                    f"**{g['valid']}/{line['lines']}**, {100 * g['field_acc']:.1f}%, "
                    f"**{g['valid_lines_per_s']:.2f}** ({line['valid_lines_per_s_ratio']:.2f}x)",
                    f"{v['valid']}/{line['lines']}, {100 * v['field_acc']:.1f}%, "
                    f"{v['valid_lines_per_s']:.2f}"))
    sp = _lines(Path(f"{prefix}-spec.jsonl"))
    if sp:
        line = sp[-1]
        used.append(line)
        parts = [f"{k} {v['spec']['tokens_per_s']:.1f} / {v['nospec']['tokens_per_s']:.1f} "
                 f"({v['spec']['vs_nospec']:.2f}x; decode "
                 f"{v['spec']['decode_tokens_per_s'] / v['nospec']['decode_tokens_per_s']:.2f}x)"
                 for k, v in line["single"].items()]
        out.append(("speculative decoding, one request at a time (`bench_spec.py --parts "
                    "single`): tokens/s with / without (TTFT included)", "; ".join(parts), ""))
    return out, used


def render(prefix: Path) -> tuple[str, bool]:
    """The markdown block (markers included) and whether HEAD's code is the code measured."""
    table, used = rows(prefix)
    if not used:
        raise SystemExit(f"no raw lines under {prefix}-*.jsonl")
    revs = sorted({_rev(x) for x in used})
    cpus = sorted({str(x.get("cpu", "?")) for x in used})
    times = sorted(str(x["time"]) for x in used if x.get("time"))
    fresh = all(same_code(r) for r in revs)
    span = f"{times[0]} to {times[-1]}" if times else "time not recorded"
    caption = (f"Generated by `benchmarks/headline.py --prefix {prefix.relative_to(ROOT)}` from "
               f"those raw lines: revision {', '.join(revs)}; {'; '.join(cpus)}; {span}; "
               "one run each, greedy, vLLM CPU 0.32 on the same weights.")
    body = ["| workload | grammarserve | vLLM CPU 0.32 |", "|---|---|---|"]
    body += [f"| {a} | {b} | {c} |" for a, b, c in table]
    return "\n".join([BEGIN, caption, "", *body, END]), fresh


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix", required=True, type=Path)
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    ap.add_argument("--strict", action="store_true", help="exit 1 unless HEAD's code was measured")
    args = ap.parse_args()
    block, fresh = render(args.prefix.resolve())
    text = args.readme.read_text()
    if args.write or args.check:
        if BEGIN not in text or END not in text:
            raise SystemExit(f"{args.readme} has no {BEGIN} ... {END} block")
        head, rest = text.split(BEGIN, 1)
        new = head + block + rest.split(END, 1)[1]
        if args.check and new != text:
            print(f"{args.readme}'s headline table differs from the raw lines", file=sys.stderr)
            sys.exit(1)
        if args.write:
            args.readme.write_text(new)
    else:
        print(block)
    if args.strict and not fresh:
        print("HEAD's code is not the code these lines measured", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
