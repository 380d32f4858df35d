"""Batch files on Ray Data (an actor pool of engines) against the local runner, on a local Ray
instance with the embedded model (needs ``grammarserve[ray]``)."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray_helpers import local_ray
from waiting import line_count, wait_until

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")
pytestmark = pytest.mark.model

from grammarserve.batch.results import recover
from grammarserve.cluster.data import RayBatchConfig, batch_dataset, run_file
from grammarserve.config import EngineConfig

ENGINE = EngineConfig(kv_cache_tokens=4096, num_threads=1)
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}


def _lines() -> list[str]:
    """200 request lines (8 shared system prompts x 25 questions, every 10th constrained, one
    with a bad schema) and one line that is not JSON."""
    out = []
    for i in range(200):
        body: dict[str, Any] = {
            "model": "default", "temperature": 0, "max_tokens": 4,
            "messages": [{"role": "system", "content": f"You answer for shop {i % 8}. " * 6},
                         {"role": "user", "content": f"Question {i}: is item {i} in stock?"}]}
        if i % 10 == 0:
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "a", "schema": SCHEMA}}
            body["max_tokens"] = 12
        if i == 7:
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "bad", "schema": {"type": "object", "minProperties": "x"}}}
        out.append(json.dumps({"custom_id": f"req-{i}", "method": "POST",
                               "url": "/v1/chat/completions", "body": body}))
    out.insert(100, "{not json")
    return out


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    with local_ray():
        yield


def _local_reference(src: Path, tmp: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from grammarserve.batch.runner import BatchRunner
    from grammarserve.engine.engine import Engine
    from grammarserve.openai.context import ModelContext

    engine = Engine(ENGINE)
    ctx = ModelContext.create(engine.tokenizer, engine.grammar.compiler,
                              max_model_len=engine.max_model_len, max_n=16, model_name="m",
                              tool_call_format=ENGINE.tool_call_format)
    BatchRunner(engine, ctx).run(src, tmp / "local.jsonl", tmp / "local.errors.jsonl")
    return recover(tmp / "local.jsonl"), recover(tmp / "local.errors.jsonl")


def _map_workers() -> list[int]:
    """Pids of Ray Data's actor-pool workers (their process title names the map operator)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"MapWorker" in cmd and b"BatchActor" in cmd:
            pids.append(int(entry.name))
    return pids


def _kill_one_when(path: Path, lines: int, killed: list[int]) -> None:
    """SIGKILL one actor once ``path`` holds ``lines`` records (mid-run)."""
    def ready() -> list[int]:
        return _map_workers() if line_count(path) >= lines else []

    try:
        pids = wait_until(ready, 900, f"{lines} output lines and a map worker", interval_s=0.2)
    except AssertionError:
        return  # the test asserts that an actor was killed
    os.kill(pids[0], signal.SIGKILL)
    killed.append(pids[0])


def _content(rec: dict[str, Any]) -> str:
    return str(rec["response"]["body"]["choices"][0]["message"]["content"])


def test_batch_with_an_actor_killed_mid_run_answers_every_line_once(
        ray_local: None, tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(_lines()) + "\n")
    out, err = tmp_path / "out.jsonl", tmp_path / "out.errors.jsonl"
    killed: list[int] = []
    killer = threading.Thread(target=_kill_one_when, args=(out, 40, killed), daemon=True)
    killer.start()
    config = RayBatchConfig(ENGINE, replicas=2, lines_per_task=20)
    summary = run_file(src, out, err, config)
    killer.join(timeout=5)
    assert killed, "no actor was killed mid-run"
    results, errors = recover(out), recover(err)
    ids = [r["custom_id"] for r in results] + [r["custom_id"] for r in errors]
    assert sorted(i for i in ids if i) == sorted(f"req-{i}" for i in range(200))
    assert len(ids) == len(set(ids)) == 201  # + the line that is not JSON (custom_id None)
    assert summary.completed == 199 and summary.failed == 2 and not summary.interrupted
    bad = {r["custom_id"]: r for r in errors}
    assert bad["req-7"]["response"]["status_code"] == 400 and bad["req-7"]["line"] == 8
    assert bad[None]["error"]["code"] == "invalid_json" and bad[None]["line"] == 101

    # Greedy output equals the local runner's, line by line.
    local, local_errors = _local_reference(src, tmp_path)
    assert {r["custom_id"]: _content(r) for r in results} == \
        {r["custom_id"]: _content(r) for r in local}
    assert {r["custom_id"]: (r.get("line"), r["response"] and r["response"]["status_code"])
            for r in errors} == {r["custom_id"]: (r.get("line"), r["response"] and
                                                  r["response"]["status_code"])
                                 for r in local_errors}

    # A re-run skips every line already answered.
    again = run_file(src, out, err, config)
    assert again.skipped == 201 and again.completed == again.failed == 0
    assert len(recover(out)) == len(results) and len(recover(err)) == len(errors)


def test_dataset_api_sorts_by_prompt_and_reports_bad_bodies(ray_local: None) -> None:
    rows = [{"custom_id": f"d{i}", "url": "/v1/chat/completions", "line": i + 1,
             "body": json.dumps({"model": "m", "temperature": 0, "max_tokens": 3, "messages": [
                 {"role": "user", "content": f"Say {i % 2}"}]})} for i in range(6)]
    rows.append({"custom_id": "broken", "url": "/v1/chat/completions", "line": 7,
                 "body": "{\n  not json"})
    out = batch_dataset(ray.data.from_items(rows),
                        RayBatchConfig(ENGINE, replicas=1, lines_per_task=4)).take_all()
    by_id = {r["custom_id"]: r for r in out}
    assert sorted(by_id) == sorted([f"d{i}" for i in range(6)] + ["broken"])
    assert not any(by_id[f"d{i}"]["error"] for i in range(6))
    broken = json.loads(by_id["broken"]["record"])
    assert by_id["broken"]["error"] and broken["line"] == 7
    assert broken["response"] is None and broken["error"]["code"] == "invalid_request"
