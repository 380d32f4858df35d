"""The verdicts of benchmarks/gpu_smoke.py: each section's figures judged pass / fail / skip with
the reason, the run's overall result and its exit status. Pure Python (no torch), so the rules are
unit-tested on CPU (tests/test_gpu_smoke_verdict.py).

A section **passes** when it ran on CUDA and its figures are within the tolerances below (a
section that only measures passes when it produced its figures); it **fails** when it raised, or
a figure is out of tolerance; it is **skipped** when it did not run (``--skip``, the time budget,
no CUDA) or ran without proving what it is for. Every section of the smoke test is about the CUDA
path, so on a run without CUDA (``--device cpu`` dry run, or ``--device cuda`` where
``torch.cuda.is_available()`` is False) a section that ran clean is a skip ("no CUDA: dry run
only"), never a pass; a section that failed still fails.

Overall, and the exit status of ``gpu_smoke.py``:

- ``"pass"``, exit 0: every section passed;
- ``"fail: <sections>"``, exit 1 (:data:`EXIT_FAIL`): at least one section failed;
- ``"skipped: no CUDA"`` (or ``"skipped: <sections>"`` on CUDA), exit 3 (:data:`EXIT_SKIPPED`):
  nothing failed but something was skipped. ``--allow-skip`` makes that exit 0 (the CPU dry run
  uses it); the label still says "skipped".

Exit 2 stays argparse's usage error.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_SKIPPED = 3

# -- tolerances against the CPU / fp32 references ---------------------------------------------------
#: CUDA fp32 (TF32 off) vs CPU fp32, max abs logit difference over the teacher-forced positions.
#: Why: the two differ only in summation order (cuBLAS vs CPU BLAS): 1.3e-4 measured on an H200 at
#: logit std 12.1 (benchmarks/README.md). TF32 left on (a 10-bit mantissa) gives differences of
#: order 1e-2..1e-1 at that scale, so 2e-3 (~15x the measurement) passes clean fp32 and fails TF32.
FP32_LOGIT_ATOL = 2e-3
#: A greedy token may differ from the CPU fp32 reference only where the reference's top-2 logit
#: margin is under ``max(NEAR_TIE_FACTOR * fp32 noise, NEAR_TIE_FLOOR)``: there the order of the
#: two is decided by summation order, not by a bug. Anywhere else a differing token fails.
NEAR_TIE_FACTOR = 10.0
NEAR_TIE_FLOOR = 1e-4
#: bf16 vs CPU fp32, teacher-forced argmax agreement at least this. Why: bf16 rounds every weight
#: and activation to 8 mantissa bits (max logit difference 1.44 measured at std 12.1), so positions
#: whose top-2 margin is under that noise may flip; 98.4% agreed on the H200. Below 95% is more
#: flips than that noise explains (a wrong kernel, a wrong cast).
BF16_ARGMAX_AGREEMENT_MIN = 0.95
#: bf16 vs CPU fp32, max abs logit difference at most this many logit standard deviations. Why:
#: 0.12 std measured (1.44 / 12.1); twice that is bf16 rounding, a whole std is not.
BF16_LOGIT_DIFF_OF_STD = 0.25
#: Attention (varlen, paged) against the torch SDPA path, max abs output difference, by dtype.
#: Why: outputs are softmax averages of N(0, 1) values, so |out| < 1. bf16: one ulp at magnitude 1
#: is 2^-7 = 7.8e-3 (4.9e-4 measured, one ulp at the outputs' ~0.1); fp32 (the CPU dry run): sums
#: of up to 16k terms in another order differ by ~sqrt(16384) x 2^-23 = 1.5e-5, so 1e-4.
ATTN_ATOL = {"bfloat16": 7.8e-3, "float16": 1e-3, "float32": 1e-4}
#: engine_paths: tokens of the 700-token shared prefix the second request must find cached (the
#: radix cache may keep the prefix in whole blocks, so not all 700).
PREFIX_MIN_CACHED = 640
#: engine_paths: jump-forward tokens the long-key JSON schema request must be given at least
#: (47 of 52 measured: most of its reply is forced key and enum text).
JSON_MIN_FORCED = 20
#: engine_process: tokens the one round-trip request asks for (``ignore_eos``).
ROUND_TRIP_TOKENS = 8


class Status(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True)
class Verdict:
    """One section's result and why."""

    status: Status
    reason: str

    def as_json(self) -> dict[str, str]:
        return {"status": self.status.value, "reason": self.reason}


def _pass(reason: str) -> Verdict:
    return Verdict(Status.PASS, reason)


def _fail(reasons: list[str]) -> Verdict:
    return Verdict(Status.FAIL, "; ".join(reasons))


def near_tie_threshold(fp32_noise: float) -> float:
    """The top-2 margin under which a greedy token may differ from the reference."""
    return max(NEAR_TIE_FACTOR * fp32_noise, NEAR_TIE_FLOOR)


def judge_parity(r: Mapping[str, Any], cuda: bool) -> Verdict:
    noise = float(r["fp32_max_abs_logit_diff"])
    threshold = near_tie_threshold(noise)
    bad: list[str] = []
    if not noise <= FP32_LOGIT_ATOL:
        bad.append(f"fp32 max abs logit diff {noise:.3g} > {FP32_LOGIT_ATOL:g}")
    for side in ("fp32", "fp32_eager"):
        for d in r[f"{side}_diverged"]:
            if not d["top2_margin"] < threshold:
                bad.append(f"{side} prompt {d['prompt']} differs at token {d['token']}, where "
                           f"the reference's top-2 margin {d['top2_margin']:.3g} is no near tie "
                           f"(< {threshold:.3g})")
    agree = float(r["bf16_teacher_forced_argmax_agreement"])
    if not agree >= BF16_ARGMAX_AGREEMENT_MIN:
        bad.append(f"bf16 argmax agreement {agree:.4f} < {BF16_ARGMAX_AGREEMENT_MIN}")
    bound = BF16_LOGIT_DIFF_OF_STD * float(r["logit_std"])
    if not float(r["bf16_max_abs_logit_diff"]) <= bound:
        bad.append(f"bf16 max abs logit diff {r['bf16_max_abs_logit_diff']} > {bound:.3g} "
                   f"({BF16_LOGIT_DIFF_OF_STD} logit std)")
    if cuda and r.get("decode_graphs") != "captured":
        bad.append(f"decode graphs not captured: {r.get('decode_graphs')}")
    if bad:
        return _fail(bad)
    ties = len(r["fp32_diverged"]) + len(r["fp32_eager_diverged"])
    return _pass(f"fp32 logit diff {noise:.3g} <= {FP32_LOGIT_ATOL:g}, greedy tokens equal"
                 f"{f' but at {ties} near ties' if ties else ''}; bf16 agreement {agree:.4f}")


def judge_engine_paths(r: Mapping[str, Any], cuda: bool) -> Verdict:
    bad = []
    if not r["json_valid"]:
        bad.append(f"schema reply invalid ({r['json_finish']}): {r['json_text'][:80]!r}")
    if not r["prefix_cached_tokens"] >= PREFIX_MIN_CACHED:
        bad.append(f"{r['prefix_cached_tokens']} prefix tokens cached < {PREFIX_MIN_CACHED}")
    if not r["cached_equals_uncached"]:
        bad.append("greedy tokens with the cached prefix differ from those without the cache")
    if not r["json_forced_tokens"] >= JSON_MIN_FORCED:
        bad.append(f"{r['json_forced_tokens']} jump-forward tokens < {JSON_MIN_FORCED}")
    if bad:
        return _fail(bad)
    return _pass(f"{r['prefix_cached_tokens']} prefix tokens cached, same tokens as uncached; "
                 f"schema reply valid with {r['json_forced_tokens']} forced tokens")


def judge_sync_debug(r: Mapping[str, Any], cuda: bool) -> Verdict:
    return _pass(f"measured only: {r['syncs']} syncs in a decode step")


def judge_engine_process(r: Mapping[str, Any], cuda: bool) -> Verdict:
    if r["tokens"] != ROUND_TRIP_TOKENS:
        return _fail([f"{r['tokens']} tokens back, asked for {ROUND_TRIP_TOKENS}"])
    return _pass(f"{ROUND_TRIP_TOKENS} tokens back, started in {r['start_s']} s")


def judge_engine_decode(r: Mapping[str, Any], cuda: bool) -> Verdict:
    bad = [f"{mode}: no steady decode step timed" for mode in ("graphs", "eager")
           if not r[mode]["steps"] or not math.isfinite(r[mode]["ms_per_step"])]
    if bad:
        return _fail(bad)
    return _pass(f"measured only: {r['graphs']['ms_per_step']} ms/step with graphs, "
                 f"{r['eager']['ms_per_step']} eager")


def judge_decode(r: Mapping[str, Any], cuda: bool) -> Verdict:
    rows = [(shape, row) for shape, s in r.items() if isinstance(s, dict) for row in s["steps"]]
    bad = [f"{shape} batch {row['batch']}: {row['error']}" for shape, row in rows
           if "error" in row]
    if cuda:
        bad += [f"{shape} batch {row['batch']}: graphs {row['graphs']}" for shape, row in rows
                if isinstance(row.get("graphs"), str)]  # "failed: ..." (a capture failed)
    if bad:
        return _fail(bad)
    skipped = [row for _, row in rows if "skipped" in row]
    if skipped or not rows:
        return Verdict(Status.SKIP, f"{len(skipped)} of {len(rows)} decode rows skipped "
                                    f"({skipped[0]['skipped'] if skipped else 'none ran'})")
    return _pass(f"measured only: {len(rows)} decode rows")


def judge_attention(r: Mapping[str, Any], cuda: bool) -> Verdict:
    dtype = r["dtype"]
    atol = ATTN_ATOL[dtype]
    bad, worst = [], 0.0
    for case, backends in r.items():
        if not isinstance(backends, dict):
            continue
        for be, fig in backends.items():
            if be == "torch":
                continue
            diff = fig.get("max_abs_diff_vs_torch")
            if diff is None or not diff <= atol:
                bad.append(f"{case} {be}: max abs diff {diff} > {atol:g} ({dtype})")
            else:
                worst = max(worst, diff)
    if bad:
        return _fail(bad)
    return _pass(f"every backend within {atol:g} of torch SDPA ({dtype}; worst {worst:.3g})")


_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")


def pytest_counts(summary: str) -> dict[str, int]:
    """The counts of a pytest summary line (``"1 failed, 35 passed, 2 skipped in 15.41s"``);
    ``error``/``errors`` both count as ``errors``."""
    counts: dict[str, int] = {}
    for n, what in _COUNT.findall(summary):
        key = "errors" if what.startswith("error") else what
        counts[key] = counts.get(key, 0) + int(n)
    return counts


def judge_kernel_tests(r: Mapping[str, Any], cuda: bool) -> Verdict:
    counts = pytest_counts(r["summary"])
    if r["returncode"] != 0 or counts.get("failed") or counts.get("errors"):
        return _fail([f"pytest exit {r['returncode']}: {r['summary']}"])
    if not counts.get("passed"):
        return Verdict(Status.SKIP, f"no kernel test ran: {r['summary']}")
    if counts.get("skipped"):
        return Verdict(Status.SKIP, f"{counts['skipped']} kernel tests skipped: {r['summary']}")
    how = "compiled" if r["compiled"] else "interpreted (TRITON_INTERPRET)"
    return _pass(f"{r['summary']} ({how})")


JUDGES = {"parity": judge_parity, "engine_paths": judge_engine_paths,
          "sync_debug": judge_sync_debug, "engine_process": judge_engine_process,
          "engine_decode": judge_engine_decode, "decode": judge_decode,
          "attention": judge_attention, "kernel_tests": judge_kernel_tests}


def judge(name: str, result: Mapping[str, Any] | None, cuda: bool) -> Verdict:
    """The verdict of section ``name`` from what it recorded (None: not run). ``cuda``: whether
    the run was on a CUDA device."""
    if result is None:
        return Verdict(Status.SKIP, "not run")
    if "error" in result:
        return Verdict(Status.FAIL, f"raised {result['error']}")
    if "skipped" in result:
        return Verdict(Status.SKIP, str(result["skipped"]))
    try:
        v = JUDGES[name](result, cuda)
    except (KeyError, TypeError, ValueError) as e:  # a figure missing: the section is broken
        return Verdict(Status.FAIL, f"figures incomplete ({type(e).__name__}: {e})")
    if v.status is Status.PASS and not cuda:
        return Verdict(Status.SKIP, f"no CUDA: dry run only ({v.reason})")
    return v


def overall(verdicts: Mapping[str, Verdict], cuda: bool, allow_skip: bool) -> tuple[str, int]:
    """The run's label and exit status (see the module docstring)."""
    failed = [n for n, v in verdicts.items() if v.status is Status.FAIL]
    if failed:
        return f"fail: {', '.join(failed)}", EXIT_FAIL
    skipped = [n for n, v in verdicts.items() if v.status is Status.SKIP]
    if skipped or not verdicts:
        label = "skipped: no CUDA" if not cuda else f"skipped: {', '.join(skipped) or 'all'}"
        return label, EXIT_OK if allow_skip else EXIT_SKIPPED
    return "pass", EXIT_OK
