"""One batch input file through vLLM's ``run_batch`` and ``grammarserve batch``, one after the other.

The acceptance line of issue 19: ``grammarserve batch`` with its defaults >= 2x vLLM CPU
``run_batch`` in valid lines per second on the same 64-line extraction input. This script writes
that input once (``bench_batch.write_input``: the shared few-shot prompt, one document per line,
the strict 7-field contact schema as ``response_format``, greedy, ``max_tokens`` 128), then runs
each runner on it in its own process, in the order of ``--runners``:

- ``vllm``: ``python -m vllm.entrypoints.openai.run_batch`` from the vLLM venv, started like
  ``start_vllm.sh`` (from the venv folder, ``HF_HUB_OFFLINE=1``, ``--dtype float32``,
  ``--max-model-len 8192``, ``VLLM_CPU_KVCACHE_SPACE`` 4 unless set, served name ``default``)
- ``grammarserve``: ``python -m grammarserve.cli batch IN -o OUT`` with its defaults (no
  ``--max-in-flight``, thread count, KV size or batch limits given)

Timing, per runner (all seconds):

- ``wall_s``: process start to exit, model load, compilation and shutdown included
- ``run_s``: the processing alone, measured the same way for both runners: from the moment the
  runner's own after-load log line reaches this script (grammarserve: ``grammarserve batch:
  loaded``; vLLM: ``Reading batch from``, logged once the engine is built, compiled and warmed
  up) to the output file's last modification. This is the time the per-second figures use.
- ``self_reported_run_s``: grammarserve's own ``elapsed_s`` (its ``--summary``; reading the input
  to the last output line), a check on ``run_s``; vLLM reports none.

Every reply is validated with ``jsonschema`` against the schema; a line counts as valid only when
it came back with status 200, was not cut by ``max_tokens`` (finish_reason ``length``) and its
content validates (``bench_batch.judge``). Prints one JSON line: per runner ``lines``, ``valid``,
``cut_by_length``, ``errors`` (no 200 reply), ``invalid`` (came back uncut, failed the schema),
the seconds, ``valid_lines_per_s``, the ``figures.py`` success figures and token counts; then
``valid_lines_per_s_ratio`` (grammarserve / vLLM, the issue's figure) and the same ratio on wall
time.

    .venv/bin/python benchmarks/peers/batch_side_by_side.py --lines 64
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import extraction_workload as wl
import jsonschema
import quality_workload as qw
from bench_batch import judge, score, write_input, write_replies
from machine import cpu_name, revision
from serverproc import GRAMMARSERVE

ROOT = Path(__file__).resolve().parent.parent.parent
# The log line each runner prints once its model is loaded and it starts on the input.
MARKERS = {"grammarserve": "grammarserve batch: loaded", "vllm": "Reading batch from"}


def vllm_command(inp: Path, out: Path, args: argparse.Namespace) -> list[str]:
    """``run_batch`` with the flags of ``start_vllm.sh`` (no tool parser: no tools here)."""
    return [str(args.vllm_venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.run_batch",
            "-i", str(inp), "-o", str(out), "--model", str(args.hf_dir),
            "--served-model-name", "default", "--dtype", "float32", "--max-model-len", "8192",
            *args.vllm_extra.split()]


def grammarserve_command(inp: Path, out: Path, summary: Path, extra: str = "") -> list[str]:
    """``grammarserve batch`` with its defaults (plus ``extra``): only the files and no
    progress bar."""
    return [GRAMMARSERVE, "batch", str(inp), "-o", str(out),
            "--summary", str(summary), "--no-progress", *extra.split()]


def _stop_group(proc: subprocess.Popen[str]) -> None:
    """End ``proc``'s process group: SIGTERM if it still runs, SIGKILL after 30 s and for any
    member left behind once it exited (the group is our child's own session)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_timed(name: str, cmd: list[str], cwd: Path, env: dict[str, str], log: Path,
              timeout_s: float) -> tuple[float, float | None, int]:
    """Run ``cmd`` in its own session, its stdout and stderr copied to ``log`` line by line.

    Returns ``(wall_s, marker_at, returncode)``: ``marker_at`` is the ``time.time()`` at which the
    runner's after-load line (``MARKERS[name]``) arrived, None if it never did.
    """
    print(f"[{name}] {' '.join(cmd)}", file=sys.stderr, flush=True)
    marker_at: float | None = None
    t0 = time.perf_counter()
    with open(log, "w") as logf:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True)
        # NOTE: the process group is our own child's (vLLM has an engine-core child process).
        watchdog = threading.Timer(timeout_s, _stop_group, (proc,))
        watchdog.start()
        try:
            for line in proc.stdout or ():
                if marker_at is None and MARKERS[name] in line:
                    marker_at = time.time()
                logf.write(line)
                logf.flush()
            rc = proc.wait()
        finally:
            watchdog.cancel()
            _stop_group(proc)
    if rc < 0:
        print(f"[{name}] stopped by signal {-rc} (--timeout {timeout_s:.0f} s?)", file=sys.stderr)
    return time.perf_counter() - t0, marker_at, rc


def read_output(out: Path, n: int) -> tuple[list[str | None], list[str | None], list[str],
                                            dict[str, int]]:
    """Replies in line order from an OpenAI batch output file (either runner's).

    Returns ``(texts, finishes, errors, usage)``: ``texts[i]`` None when line ``i`` got no 200
    reply; ``errors`` one short message per such line; ``usage`` the summed token counts.
    """
    texts: dict[str, str | None] = {}
    finishes: dict[str, str | None] = {}
    usage = {"prompt_tokens": 0, "completion_tokens": 0}
    problems: dict[str, str] = {}
    lines = out.read_text().splitlines() if out.exists() else []
    for raw in lines:
        rec = json.loads(raw)
        cid, resp = rec.get("custom_id"), rec.get("response") or {}
        body = resp.get("body")
        if resp.get("status_code") != 200 or not body or rec.get("error"):
            problems[cid] = json.dumps(rec.get("error") or resp)[:300]
            continue
        choice = body["choices"][0]
        texts[cid] = choice["message"].get("content")
        finishes[cid] = choice.get("finish_reason")
        for k in usage:
            usage[k] += int((body.get("usage") or {}).get(k) or 0)
    ids = [f"doc-{i}" for i in range(n)]
    errors = [f"{c}: {problems.get(c, 'no output line')}" for c in ids if texts.get(c) is None]
    return [texts.get(c) for c in ids], [finishes.get(c) for c in ids], errors, usage


def run_side(name: str, inp: Path, expected: list[dict[str, Any]], work: Path,
             args: argparse.Namespace) -> dict[str, Any]:
    """One runner on ``inp``: run it, read and validate its output, the figures."""
    out, log, summary = work / f"{name}-out.jsonl", work / f"{name}.log", work / "summary.json"
    for p in (out, summary, out.with_suffix(".errors.jsonl")):
        p.unlink(missing_ok=True)  # grammarserve batch resumes from an existing output file
    env = dict(os.environ)
    if name == "vllm":
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
        # Not from the repo root: `python -m` puts the working directory first on sys.path and
        # the repo's kernels/ folder would shadow the `kernels` package transformers probes for.
        cmd, cwd = vllm_command(inp, out, args), args.vllm_venv
    else:
        cmd, cwd = grammarserve_command(inp, out, summary, args.grammarserve_extra), ROOT
    wall, marker_at, rc = run_timed(name, cmd, cwd, env, log, args.timeout)
    n = len(expected)
    texts, finishes, errors, usage = read_output(out, n)
    run_s = (round(out.stat().st_mtime - marker_at, 2)
             if marker_at is not None and out.exists() else None)
    if args.workload == "contacts":
        valid = sum(judge(t, f) for t, f in zip(texts, finishes))
        scores = score(texts, finishes, expected, run_s or wall)
    else:
        valid, scores = _shape_scores(qw.SHAPES[args.workload], texts, finishes, expected)
    cut = sum(f == "length" for f in finishes)
    if args.dump_replies:
        write_replies(args.dump_replies, name, texts, finishes)
    res: dict[str, Any] = {
        "lines": n, "valid": valid, "cut_by_length": cut, "errors": len(errors),
        "invalid": n - valid - cut - len(errors), "run_s": run_s, "wall_s": round(wall, 2),
        "valid_lines_per_s": round(valid / run_s, 4) if run_s else None,
        "valid_lines_per_s_wall": round(valid / wall, 4),
        **scores,
        "output_tokens": usage["completion_tokens"], "prompt_tokens": usage["prompt_tokens"],
        "output_tokens_per_s": round(usage["completion_tokens"] / run_s, 2) if run_s else None,
        "returncode": rc, "log": str(log) if args.workdir else None}
    if summary.exists():
        res["self_reported_run_s"] = json.loads(summary.read_text()).get("elapsed_s")
    if errors:
        res["first_errors"] = errors[:3]
    if rc != 0 or marker_at is None:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        print(f"[{name}] exit {rc}, after-load line seen: {marker_at is not None}; log tail:\n"
              + "\n".join(tail), file=sys.stderr)
    return res


def _shape_scores(shape: qw.Shape, texts: list[str | None], finishes: list[str | None],
                  truths: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """Valid lines (stop, parses, validates) and field accuracy of a quality-matrix shape."""
    valid, correct, total = 0, 0, 0
    for text, finish, truth in zip(texts, finishes, truths):
        parsed: Any = None
        try:
            parsed = json.loads(text or "")
            jsonschema.validate(parsed, shape.schema)
            ok = finish != "length"
        except (ValueError, jsonschema.ValidationError):
            ok = False
        valid += ok
        c, t = qw.field_scores(truth, parsed if ok else None)
        correct, total = correct + c, total + t
    return valid, {"field_acc": round(correct / total, 4) if total else 0.0}


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` to 2 places, None when either is missing or zero."""
    return round(a / b, 2) if a and b else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=64)
    ap.add_argument("--shots", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--few-shot-style", choices=wl.FEW_SHOT_STYLES, default="spaced")
    ap.add_argument("--workload", choices=["contacts", *qw.SHAPES], default="contacts",
                    help="contacts: the few-shot 7-field extraction (issue 19); a quality-matrix "
                         "shape (e.g. array_of_objects) asked in --prompt-style")
    ap.add_argument("--prompt-style", choices=qw.PROMPT_STYLES, default="no_json")
    ap.add_argument("--runners", default="vllm,grammarserve",
                    help="comma-separated, run in this order (default: vllm,grammarserve)")
    ap.add_argument("--vllm-venv", type=Path,
                    default=Path(os.environ.get("VLLM_VENV", "/work/peers/vllm")))
    ap.add_argument("--hf-dir", type=Path,
                    default=Path(os.environ.get("HF_DIR", "/work/peers/smollm2-hf")))
    ap.add_argument("--vllm-extra", default=os.environ.get("VLLM_EXTRA", ""),
                    help="extra run_batch arguments, one string")
    ap.add_argument("--grammarserve-extra", default="",
                    help="extra `grammarserve batch` arguments, one string (default: none)")
    ap.add_argument("--timeout", type=float, default=5400,
                    help="seconds per runner, load included (vLLM's first start compiles the "
                         "model for ~8 min)")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="keep the input, outputs and logs here (default: a temp folder)")
    ap.add_argument("--dump-replies", metavar="PATH", type=Path, default=None,
                    help="write each reply (side, text, finish_reason, valid) as JSONL")
    args = ap.parse_args()
    runners = [r.strip() for r in args.runners.split(",") if r.strip()]
    if unknown := set(runners) - set(MARKERS):
        ap.error(f"unknown runner(s) {sorted(unknown)}; choose from {sorted(MARKERS)}")
    if "vllm" in runners and not (args.vllm_venv / "bin" / "python").exists():
        ap.error(f"no vLLM venv at {args.vllm_venv}: run benchmarks/peers/install_vllm.sh")
    if args.dump_replies:
        args.dump_replies.write_text("")
    tmp = None if args.workdir else tempfile.mkdtemp(prefix="batch_side_by_side-")
    work = (args.workdir or Path(tmp or "")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    try:
        inp = work / "in.jsonl"
        expected = (write_input(inp, args.lines, args.shots, args.max_tokens,
                                args.few_shot_style) if args.workload == "contacts" else
                    qw.batch_input(inp, qw.SHAPES[args.workload], args.prompt_style, args.lines,
                                   args.max_tokens))
        result: dict[str, Any] = {"bench": "batch_side_by_side", "lines": args.lines,
                                  "shots": args.shots, "max_tokens": args.max_tokens,
                                  "few_shot_style": args.few_shot_style,
                                  "workload": args.workload, "prompt_style": args.prompt_style,
                                  "grammarserve_extra": args.grammarserve_extra,
                                  "git": revision(), "cpu": cpu_name(),
                                  "cpu_count": os.cpu_count(),
                                  "loadavg_start": [round(x, 2) for x in os.getloadavg()],
                                  "runners": runners}
        for name in runners:
            result[name] = run_side(name, inp, expected, work, args)
        if "vllm" in result and "grammarserve" in result:
            gs, vl = result["grammarserve"], result["vllm"]
            result["valid_lines_per_s_ratio"] = ratio(gs["valid_lines_per_s"],
                                                      vl["valid_lines_per_s"])
            result["valid_lines_per_s_wall_ratio"] = ratio(gs["valid_lines_per_s_wall"],
                                                           vl["valid_lines_per_s_wall"])
        result["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        result["workdir"] = str(work) if args.workdir else None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
