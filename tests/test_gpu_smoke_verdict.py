"""benchmarks/gpu_smoke.py's verdicts (benchmarks/smoke_verdict.py), on CPU: a section is pass /
fail / skip with its reason, figures are held to named tolerances, a skip is never an overall
pass, and the exit status says which (0 pass, 1 fail, 3 skipped; 0 for a skip only with
``--allow-skip``). The figures below are those of the H200 run in benchmarks/README.md."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import smoke_verdict as sv
from smoke_verdict import Status, judge, overall, pytest_counts

ROWS = [{"batch": b, "graphs": g, "ms_per_step": 8.5, "tokens_per_s": 3700.0}
        for b in (32, 1, 128) for g in (True, False)]
H200: dict[str, dict[str, Any]] = {
    "parity": {"decode_graphs": "captured", "fp32_eager_equal_prompts": 4, "prompts": 4,
               "tokens_each": 32, "fp32_equal_prompts": 4, "fp32_first_diff": [32] * 4,
               "fp32_diverged": [], "fp32_eager_diverged": [],
               "bf16_first_diff": [0, 31, 32, 32], "fp32_max_abs_logit_diff": 1.297e-4,
               "logit_std": 12.117, "top2_margin_median": 9.8772,
               "near_tie_threshold": 1.297e-3, "near_tie_fraction": 0.0,
               "bf16_teacher_forced_argmax_agreement": 0.9844,
               "bf16_max_abs_logit_diff": 1.4446, "seconds": 19.9},
    "engine_paths": {"prefix_cached_tokens": 700, "a_cached": 0, "cached_equals_uncached": True,
                     "json_valid": True, "json_finish": "stop", "json_tokens": 52,
                     "json_forced_tokens": 47, "json_text": "{}"},
    "sync_debug": {"syncs": 2, "by_line": {}, "step_ms": 3.12},
    "engine_process": {"start_s": 11.9, "tokens": 8, "finish": "length"},
    "engine_decode": {"graphs": {"ms_per_step": 3.846, "tokens_per_s": 8320.4, "steps": 43},
                      "eager": {"ms_per_step": 18.863, "tokens_per_s": 1696.4, "steps": 43}},
    "decode": {"llama-3.1-8b": {"weights_gib": 14.96, "steps": copy.deepcopy(ROWS)}},
    "attention": {"dtype": "bfloat16",
                  "decode_b32_ctx4096": {"varlen": {"ms": 0.77, "max_abs_diff_vs_torch": 4.88e-4},
                                         "torch": {"ms": 1.05},
                                         "paged": {"ms": 0.40, "max_abs_diff_vs_torch": 4.88e-4}}},
    "kernel_tests": {"returncode": 0, "summary": "36 passed in 16.65s", "compiled": True},
}


def _verdicts(figures: dict[str, Any], cuda: bool) -> dict[str, sv.Verdict]:
    return {name: judge(name, figures.get(name), cuda) for name in H200}


def _with(section: str, **changes: Any) -> dict[str, Any]:
    figures = copy.deepcopy(H200)
    figures[section].update(changes)
    return figures


def test_the_h200_run_passes_every_section() -> None:
    verdicts = _verdicts(H200, cuda=True)
    assert {n: v.status for n, v in verdicts.items()} == dict.fromkeys(H200, Status.PASS)
    assert overall(verdicts, cuda=True, allow_skip=False) == ("pass", sv.EXIT_OK)
    assert verdicts["parity"].reason.startswith("fp32 logit diff 0.00013 <= 0.002, greedy tokens equal")


def test_a_skipped_section_is_no_pass() -> None:
    figures = copy.deepcopy(H200)
    figures["sync_debug"] = {"skipped": "CUDA only"}
    verdicts = _verdicts(figures, cuda=True)
    assert verdicts["sync_debug"] == sv.Verdict(Status.SKIP, "CUDA only")
    assert overall(verdicts, cuda=True, allow_skip=False) == ("skipped: sync_debug",
                                                              sv.EXIT_SKIPPED)
    assert overall(verdicts, cuda=True, allow_skip=True) == ("skipped: sync_debug", sv.EXIT_OK)
    del figures["sync_debug"]  # never recorded (a crash before it)
    assert _verdicts(figures, cuda=True)["sync_debug"].status is Status.SKIP


def test_without_cuda_a_clean_run_is_skipped_not_passed() -> None:
    verdicts = _verdicts(H200, cuda=False)
    assert all(v.status is Status.SKIP and v.reason.startswith("no CUDA: dry run only")
               for v in verdicts.values()), verdicts
    assert overall(verdicts, cuda=False, allow_skip=False) == ("skipped: no CUDA",
                                                               sv.EXIT_SKIPPED)
    assert overall(verdicts, cuda=False, allow_skip=True) == ("skipped: no CUDA", sv.EXIT_OK)


def test_a_failure_fails_the_run_even_beside_skips_and_allow_skip() -> None:
    figures = _with("engine_paths", cached_equals_uncached=False)
    figures["sync_debug"] = {"skipped": "CUDA only"}
    verdicts = _verdicts(figures, cuda=False)
    assert verdicts["engine_paths"].status is Status.FAIL
    assert "differ from those without the cache" in verdicts["engine_paths"].reason
    assert overall(verdicts, cuda=False, allow_skip=True) == ("fail: engine_paths",
                                                              sv.EXIT_FAIL)


@pytest.mark.parametrize(("section", "changes", "reason"), [
    ("parity", {"fp32_max_abs_logit_diff": 0.05}, "fp32 max abs logit diff 0.05 > 0.002"),
    ("parity", {"bf16_teacher_forced_argmax_agreement": 0.9}, "bf16 argmax agreement 0.9000"),
    ("parity", {"bf16_max_abs_logit_diff": 4.0}, "bf16 max abs logit diff 4.0 > 3.03"),
    ("parity", {"decode_graphs": "failed: capture error"}, "decode graphs not captured"),
    ("parity", {"fp32_diverged": [{"prompt": 2, "token": 5, "top2_margin": 3.1}]},
     "fp32 prompt 2 differs at token 5, where the reference's top-2 margin 3.1 is no near tie"),
    ("engine_paths", {"json_valid": False}, "schema reply invalid"),
    ("engine_paths", {"prefix_cached_tokens": 0}, "0 prefix tokens cached < 640"),
    ("engine_process", {"tokens": 3}, "3 tokens back, asked for 8"),
    ("engine_decode", {"graphs": {"ms_per_step": float("nan"), "steps": 0}},
     "graphs: no steady decode step timed"),
    ("kernel_tests", {"returncode": 1, "summary": "1 failed, 35 passed in 15.41s"},
     "pytest exit 1: 1 failed, 35 passed"),
    ("attention", {"decode_b32_ctx4096": {"varlen": {"max_abs_diff_vs_torch": 0.03},
                                          "paged": {"max_abs_diff_vs_torch": 4.9e-4}}},
     "decode_b32_ctx4096 varlen: max abs diff 0.03 > 0.0078 (bfloat16)"),
    ("attention", {"decode_b32_ctx4096": {"paged": {"ms": 0.4}}}, "max abs diff None"),
])
def test_a_figure_out_of_tolerance_fails(section: str, changes: dict[str, Any],
                                         reason: str) -> None:
    verdicts = _verdicts(_with(section, **changes), cuda=True)
    assert verdicts[section].status is Status.FAIL and reason in verdicts[section].reason, \
        verdicts[section]
    assert overall(verdicts, cuda=True, allow_skip=True) == (f"fail: {section}", sv.EXIT_FAIL)


def test_a_greedy_difference_at_a_near_tie_passes() -> None:
    tie = sv.near_tie_threshold(1.297e-4) / 2
    figures = _with("parity", fp32_eager_diverged=[{"prompt": 0, "token": 9, "top2_margin": tie}])
    verdict = judge("parity", figures["parity"], cuda=True)
    assert verdict.status is Status.PASS and "at 1 near ties" in verdict.reason


def test_decode_rows_errors_fail_and_budget_skips_skip() -> None:
    rows = copy.deepcopy(ROWS)
    rows[3] = {"batch": 1, "graphs": False, "error": "OutOfMemoryError: CUDA out of memory"}
    verdict = judge("decode", {"llama-3.1-8b": {"steps": rows}}, cuda=True)
    assert verdict.status is Status.FAIL and "batch 1: OutOfMemoryError" in verdict.reason
    rows[3] = {"batch": 128, "skipped": "time budget"}
    verdict = judge("decode", {"llama-3.1-8b": {"steps": rows}}, cuda=True)
    assert verdict == sv.Verdict(Status.SKIP, "1 of 6 decode rows skipped (time budget)")
    rows[3] = {**ROWS[3], "graphs": "failed: capture error"}
    assert judge("decode", {"x": {"steps": rows}}, cuda=True).status is Status.FAIL


def test_kernel_tests_that_skipped_or_did_not_run_are_skips() -> None:
    for summary, why in (("34 passed, 2 skipped in 9.1s", "2 kernel tests skipped"),
                         ("36 skipped in 2.0s", "no kernel test ran"),
                         ("no tests ran in 0.01s", "no kernel test ran")):
        verdict = judge("kernel_tests", {"returncode": 0, "summary": summary, "compiled": True},
                        cuda=True)
        assert verdict.status is Status.SKIP and verdict.reason.startswith(why), verdict
    assert pytest_counts("1 failed, 35 passed, 2 skipped, 1 error in 15.41s") == {
        "failed": 1, "passed": 35, "skipped": 2, "errors": 1}


def test_a_section_that_raised_or_lacks_a_figure_fails() -> None:
    raised = judge("parity", {"error": "RuntimeError: CUDA error", "where": []}, cuda=True)
    assert raised == sv.Verdict(Status.FAIL, "raised RuntimeError: CUDA error")
    figures = copy.deepcopy(H200["parity"])
    del figures["fp32_diverged"]
    missing = judge("parity", figures, cuda=True)
    assert missing.status is Status.FAIL and "figures incomplete" in missing.reason


@pytest.fixture(scope="module")
def gpu_smoke() -> Any:
    import gpu_smoke

    return gpu_smoke


@pytest.mark.parametrize(("allow_skip", "status"), [(False, 3), (True, 0)])
def test_a_cuda_run_without_cuda_reports_skipped_no_cuda(
        gpu_smoke: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], allow_skip: bool, status: int) -> None:
    monkeypatch.setattr(gpu_smoke.torch.cuda, "is_available", lambda: False)
    out = tmp_path / "smoke.json"
    argv = ["--device", "cuda", "--out", str(out)] + (["--allow-skip"] if allow_skip else [])
    assert gpu_smoke.main(argv) == status
    line = json.loads(out.read_text())
    assert line["overall"] == "skipped: no CUDA" and line["ok"] is False
    assert {v["status"] for v in line["verdicts"].values()} == {"skip"}
    assert set(line["verdicts"]) == set(gpu_smoke.SECTIONS) == set(H200)
    assert line["git"] and line["cpu"] and line["time"]
    assert json.loads(capsys.readouterr().out) == line
