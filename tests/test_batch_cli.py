"""``grammarserve batch`` end to end: killed (SIGKILL, plus a torn last line) mid-run, then re-run
to completion; no custom_id missing or duplicated, bad lines reported once with their numbers."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from server_helpers import GRAMMARSERVE
from test_batch_server import check_output, schema_line
from waiting import wait_lines

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parent.parent


def _cmd(inp: Path, out: Path, err: Path, *extra: str) -> list[str]:
    return [GRAMMARSERVE, "batch", str(inp), "-o", str(out),
            "--errors", str(err), "--kv-cache-tokens", "16384", "--max-num-reqs", "8",
            "--num-threads", "1", *extra]


def test_cli_killed_mid_run_resumes_without_loss(tmp_path: Path) -> None:
    bad_schema = {"type": "object", "properties": {"a": {"type": "strin"}}}
    lines = [schema_line(i) for i in range(30)]
    lines[4:4] = ["{not json"]  # line 5
    lines[9:9] = [json.dumps({"method": "POST", "url": "/v1/completions", "body": {}})]  # 10
    lines[14:14] = [schema_line(0, cid="req-3")]  # line 15: duplicate custom_id
    lines[19:19] = [schema_line(1, cid="bad-schema", schema=bad_schema)]  # line 20
    inp, out, err = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    log = tmp_path / "run1.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(_cmd(inp, out, err, "--no-progress"), stdout=f,
                                stderr=subprocess.STDOUT, cwd=ROOT)
    wait_lines(out, 1, 300, "the first output line", proc, log)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    first = out.read_text().count("\n")
    assert first < 30, "the run finished before the kill"
    with open(out, "ab") as f:
        f.write(b'{"id": "batch_req_torn", "custom_id": "req-2')  # a write cut short
    summary = tmp_path / "summary.json"
    run = subprocess.run(_cmd(inp, out, err, "--summary", str(summary)), check=False, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "tok_s=" in run.stderr and "<" in run.stderr  # progress bar: rates and ETA
    report = json.loads(summary.read_text())
    assert report["skipped"] >= first and report["total_lines"] == 34
    check_output(out.read_text(), {f"req-{i}" for i in range(30)})
    errors = [json.loads(x) for x in err.read_text().splitlines()]
    assert sorted(x["line"] for x in errors) == [5, 10, 15, 20]  # each reported once
    by_line = {x["line"]: x for x in errors}
    assert by_line[5]["error"]["code"] == "invalid_json"
    assert by_line[10]["error"]["code"] == "missing_custom_id"
    assert by_line[15]["error"]["code"] == "duplicate_custom_id"
    assert by_line[20]["response"]["status_code"] == 400
    assert "Invalid schema" in by_line[20]["response"]["body"]["error"]["message"]
