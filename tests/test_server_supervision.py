"""Engine supervision end to end: the real server, its engine SIGKILLed under load while a Batch
API job runs. The server stays up, answers 503 (``/health``, ``/v1/models``, new requests) while
it restarts the engine, then serves again; the batch finishes with every line exactly once. With
no restarts allowed, the server exits non-zero instead."""

from __future__ import annotations

import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from batch_http import CHAT, chat, start_batch, wait_batch
from serverproc import ServerProcess, metrics, request
from waiting import wait_until

from grammarserve.server.config import RestartPolicy
from grammarserve.server.supervisor import EngineSupervisor, RestartBudget


LINES = 40
#: Generous: a restart reloads the model on a machine busy with other work.
RESTART_BOUND_S = 300


@pytest.mark.model
def test_killed_engine_is_restarted_and_the_batch_finishes_once(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "server.log", "--data-dir", str(tmp_path / "data"),
                        "--kv-cache-tokens", "16384", "--max-num-reqs", "8",
                        "--engine-restart-backoff", "0.5")
    srv.start()
    try:
        bid = start_batch(srv.url, LINES)
        wait_batch(srv.url, bid, lambda b: b["request_counts"]["completed"] >= 2)
        statuses: list[int] = []
        stop, answered = threading.Event(), threading.Semaphore(0)

        def load(k: int) -> None:  # interactive traffic beside the batch, until told to stop
            i = 0
            while not stop.is_set():
                statuses.append(request("POST", srv.url + CHAT, chat(1000 * k + i, 48))[0])
                answered.release()
                i += 1

        with ThreadPoolExecutor(3) as pool:
            for k in range(3):
                pool.submit(load, k)
            for _ in range(3):
                assert answered.acquire(timeout=RESTART_BOUND_S)
            old = srv.kill_engine()
            seen: set[tuple[int, str, int]] = set()

            def down_then_back() -> bool:
                status, body = request("GET", srv.url + "/health")
                models = request("GET", srv.url + "/v1/models")[0]
                seen.add((status, body.get("status", "") if isinstance(body, dict) else "",
                          models))
                return status == 200 and any(x[0] == 503 for x in seen)

            wait_until(down_then_back, RESTART_BOUND_S, "the engine down, then back",
                       interval_s=0.25)
            stop.set()
        assert srv.proc is not None and srv.proc.poll() is None  # the server itself lived on
        assert (503, "restarting", 503) in seen and (200, "ok", 200) in seen, seen
        assert set(statuses) <= {200, 503} and 503 in statuses, statuses
        assert request("POST", srv.url + CHAT, chat(7))[0] == 200
        assert srv.engine_pid() not in (None, old)
        assert metrics(srv.url)["grammarserve_engine_restarts_total"] == 1.0
        done = wait_batch(srv.url, bid, lambda b: b["status"] in ("completed", "failed"))
        assert done["status"] == "completed", done
        assert done["request_counts"] == {"total": LINES, "completed": LINES, "failed": 0}
        status, text = request("GET", f"{srv.url}/v1/files/{done['output_file_id']}/content")
        ids = [json.loads(x)["custom_id"] for x in text.splitlines()]
        assert sorted(ids) == sorted(f"req-{i}" for i in range(LINES))  # each exactly once
    finally:
        srv.stop()


@pytest.mark.model
def test_server_exits_non_zero_when_its_restarts_are_spent(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "server.log", "--engine-max-restarts", "0")
    srv.start()
    try:
        srv.kill_engine()
        assert srv.proc is not None
        code = srv.proc.wait(RESTART_BOUND_S)
        assert code != 0
        assert "giving up after 0 restarts" in (tmp_path / "server.log").read_text()
    finally:
        srv.stop()


def test_deaths_blamed_on_requests_have_a_budget_of_their_own() -> None:
    """A death blamed on a request never spends the restart budget, but its own: within it the
    backoff doubles; past it each restart waits the longest backoff (the server lives on)."""
    policy = RestartPolicy(max_restarts=1, window_s=100, backoff_s=1, max_backoff_s=30,
                           max_request_crashes=3)
    sup = EngineSupervisor(None, lambda: None, policy,  # type: ignore[arg-type]
                           on_down=print, on_up=print, on_give_up=print)
    assert [sup._request_delay() for _ in range(5)] == [1.0, 2.0, 4.0, 30.0, 30.0]
    assert sup.request_deaths == 5 and sup.budget.recent == 0
    clock = [0.0]
    budget = RestartBudget(policy, lambda: clock[0], allowed=2)
    assert budget.on_death() == 1.0 and budget.on_death() == 2.0 and budget.on_death() is None
    clock[0] = 201.0  # the window has passed
    assert budget.on_death() == 1.0
