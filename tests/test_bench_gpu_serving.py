"""benchmarks/bench_gpu_serving.py (issue 38): its pure parts (workload, rooflines) and its CPU dry
run (``--device cpu --small``: the same engine path on a tiny random decoder with the embedded
model's tokenizer), whose JSON line must carry every figure, finish every request and produce
constrained replies that validate against their schemas."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))
from gpu_serving_workload import (
    ModelBytes,
    WorkloadShape,
    decode_roofline_ms,
    gpu_peak,
    is_constrained,
    load_schema,
    percentiles,
    prefill_roofline_tokens_s,
    prompt_lengths,
    requests,
)


def test_constrained_share_is_spread_evenly() -> None:
    assert [is_constrained(i, 0.5) for i in range(4)] == [False, True, False, True]
    assert all(is_constrained(i, 1.0) for i in range(7))
    assert not any(is_constrained(i, 0.0) for i in range(7))
    assert sum(is_constrained(i, 0.5) for i in range(256)) == 128


def test_prompt_lengths_are_seeded_and_in_range() -> None:
    a = prompt_lengths(200, 64, 2048, seed=3)
    assert a == prompt_lengths(200, 64, 2048, seed=3) and min(a) >= 64 and max(a) <= 2048
    assert len(set(a)) > 50  # mixed, not one length


def test_requests_mix_free_and_schema_constrained() -> None:
    shape = WorkloadShape(16, 64, 8, 100, token_lo=100, token_hi=1000)
    reqs = requests(8, 0.5, shape, "t")
    free = [r for r in reqs if r.schema_name is None]
    bound = [r for r in reqs if r.schema_name is not None]
    assert len(free) == len(bound) == 4
    assert all(r.params.ignore_eos and r.params.max_tokens == 8 for r in free)
    assert all(r.params.constraint is not None and r.params.max_tokens == 100 for r in bound)
    assert all(100 <= t < 1000 for r in reqs for t in r.prompt_ids)
    assert [r.prompt_ids for r in reqs] == [r.prompt_ids for r in requests(8, 1.0, shape, "u")]


def test_rooflines() -> None:
    h200 = gpu_peak("NVIDIA H200")
    assert h200 is not None and h200.bandwidth_bytes_s == 4.8e12 and h200.bf16_flops == 989e12
    assert gpu_peak("NVIDIA H100 PCIe") != gpu_peak("NVIDIA H100 80GB HBM3")
    assert gpu_peak(None) is None and gpu_peak("Some GPU") is None
    cpu = gpu_peak(None, bandwidth_gbs=100, tflops=2)
    assert cpu is not None and cpu.bandwidth_bytes_s == 1e11
    mb = ModelBytes(decode_weight_bytes=16 * 10**9, layer_params=7 * 10**9,
                    kv_bytes_per_token=131072)
    assert decode_roofline_ms(mb, 0, h200) == pytest.approx(1000 * 16e9 / 4.8e12)
    assert decode_roofline_ms(mb, 10**5, h200) > decode_roofline_ms(mb, 0, h200)  # type: ignore
    assert decode_roofline_ms(mb, 0, None) is None
    assert prefill_roofline_tokens_s(mb, h200) == pytest.approx(989e12 / 14e9)
    assert percentiles([]) == {"p50": None, "p99": None}
    assert percentiles([float(x) for x in range(1, 101)]) == {"p50": 50.0, "p99": 99.0}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[Any]]:
    replies = tmp_path_factory.mktemp("gpu_serving") / "replies.jsonl"
    proc = subprocess.run([sys.executable, str(BENCH / "bench_gpu_serving.py"), "--device",
                           "cpu", "--small", "--replies", str(replies)], cwd=ROOT,
                          capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, proc.stdout[-2000:]
    return json.loads(lines[0]), [json.loads(ln) for ln in replies.read_text().splitlines()]


@pytest.mark.model
def test_dry_run_reports_every_point(dry_run: tuple[dict[str, Any], list[Any]]) -> None:
    result, _ = dry_run
    assert {"git", "cpu", "time"} <= set(result) and result["bench"] == "gpu_serving"
    assert result["device"] == "cpu" and result["peak"] is None
    shape = result["shapes"]["tiny"]
    assert shape["vocab_size"] > shape["tokenizer_tokens"]  # padded, as the GPU shapes are
    assert shape["syncs"] is None  # counted on CUDA only
    assert shape["bitmask_ring"]["depth"] == 1 and not shape["bitmask_ring"]["pinned"]
    points = shape["points"]
    assert {(p["constrained_fraction"], p["batch"]) for p in points} == {
        (f, b) for f in (0.0, 0.5, 1.0) for b in (1, 4)}
    for p in points:
        assert p["finished"] == p["requests"] == 2 * p["batch"] and p["errors"] == 0
        assert p["requests_per_s"] > 0 and p["output_tokens_per_s"] > 0
        assert p["decode"]["steady_steps"] > 0 and p["decode"]["ms_per_step"] > 0
        assert p["decode"]["roofline_ms"] is None and p["decode"]["context_tokens_mean"] > 0
        assert p["prefill"]["tokens"] > 0 and p["prefill"]["tokens_per_s"] > 0
        for key in ("ttft_ms", "itl_ms"):
            assert 0 < p[key]["p50"] <= p[key]["p99"]
        expected = round(p["requests"] * p["constrained_fraction"])
        assert p["constrained"] == expected
        assert p["constrained_valid"] == p["constrained_stopped"] == expected
    for batch in ("1", "4"):
        for frac in ("0.5", "1.0"):
            r = shape["ratios"][batch][frac]
            assert r["decode"] > 0 and r["output"] > 0


@pytest.mark.model
def test_dry_run_constrained_replies_validate(dry_run: tuple[dict[str, Any], list[Any]]) -> None:
    _, replies = dry_run
    assert len(replies) == 2 * (1 + 4) * 1.5  # fractions 0.5 and 1.0 at batches 1 and 4
    for r in replies:
        assert r["finish"] == "stop"
        jsonschema.validate(json.loads(r["text"]), load_schema(r["schema"]))


def test_sync_counter_attributes_warnings_to_the_repository_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The counting of benchmarks/sync_count.py without CUDA: sync-debug is stubbed and the
    warning torch would give is issued by hand."""
    import warnings

    import torch
    from sync_count import SyncCounter

    modes: list[object] = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    counter = SyncCounter(torch.device("cpu"))
    assert not counter.active and counter.as_json() is None
    counter.active = True
    with counter.watch():
        warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)
    with counter.watch():
        pass
    line = f"tests/test_bench_gpu_serving.py:{sys._getframe().f_lineno - 4}"
    assert modes == ["warn", 0, "warn", 0]
    assert counter.as_json() == {"steps": 2, "count": 1, "per_step_max": 1,
                                 "by_line": {line: 1}}
