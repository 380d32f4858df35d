"""The Ray Serve application on a local Ray instance: 2 engine replicas of the embedded model
behind the OpenAI routes, used with the official ``openai`` SDK (needs ``grammarserve[ray]``)."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytestmark = pytest.mark.model

from prometheus_client.parser import text_string_to_metric_families

from grammarserve.cluster.serve import APP_NAME, RayServeConfig, build_app
from grammarserve.config import EngineConfig
from grammarserve.server.config import ServerConfig

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    ray.init(num_cpus=2, object_store_memory=200 * 2**20, include_dashboard=False,
             log_to_driver=False)
    try:
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        config = RayServeConfig(ServerConfig(engine=EngineConfig(kv_cache_tokens=2048,
                                                                 num_threads=1),
                                             data_dir=tmp_path_factory.mktemp("data")),
                                replicas=2, health_period_s=2.0)
        serve.run(build_app(config), name=APP_NAME, route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 600  # generous: a loaded 2-core machine
        while time.monotonic() < deadline:
            r = httpx.get(f"{url}/health", timeout=30)
            if r.status_code == 200 and r.json().get("replicas_ready") == 2:
                break
            time.sleep(1)
        yield url
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture
def client(base_url: str) -> Any:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", timeout=300)


def _served(base_url: str) -> dict[str, float]:
    text = httpx.get(f"{base_url}/metrics", timeout=60).text
    for family in text_string_to_metric_families(text):
        if family.name == "grammarserve_replica_served_requests":
            return {s.labels["replica"]: s.value for s in family.samples
                    if s.name.endswith("_total") or s.name == family.name}
    return {}


def test_health_counts_both_replicas(base_url: str) -> None:
    r = httpx.get(f"{base_url}/health", timeout=30)
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "replicas_ready": 2, "replicas": 2}


def test_json_schema_reply_is_valid(client: Any) -> None:
    out = client.chat.completions.create(
        model="default", temperature=0, max_tokens=48,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}})
    choice = out.choices[0]
    assert choice.finish_reason == "stop"
    value = json.loads(choice.message.content)
    assert set(value) == {"name", "age"} and isinstance(value["age"], int)


def test_tool_call(client: Any) -> None:
    out = client.chat.completions.create(
        model="default", temperature=0, max_tokens=48, tools=TOOLS, tool_choice="required",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    calls = out.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    assert "city" in json.loads(calls[0].function.arguments)


def test_stream(client: Any) -> None:
    chunks = list(client.chat.completions.create(
        model="default", temperature=0, max_tokens=16, stream=True,
        messages=[{"role": "user", "content": "Say hello."}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_bad_schema_is_a_400(client: Any) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="default", max_tokens=8, messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema", "json_schema": {
                "name": "bad", "schema": {"type": "object", "minProperties": "two"}}})
    assert e.value.status_code == 400


def test_requests_sharing_a_prompt_land_on_one_replica(base_url: str, client: Any) -> None:
    system = ("You are the support assistant of a bicycle shop. " * 12).strip()
    before = _served(base_url)
    for i in range(4):
        client.chat.completions.create(
            model="default", temperature=0, max_tokens=4,
            messages=[{"role": "system", "content": system},
                      {"role": "user", "content": f"Question {i}: are you open today?"}])
    deadline = time.monotonic() + 60  # a replica counts a request when its stream closes
    while time.monotonic() < deadline:
        after = _served(base_url)
        gained = {r: after[r] - before.get(r, 0) for r in after}
        if sum(gained.values()) >= 4:
            break
        time.sleep(0.5)
    assert len(after) == 2
    assert sorted(gained.values()) == [0, 4]


def _engine_pids() -> list[int]:
    """Pids of the replicas' engine processes (children of the EngineReplica actors)."""
    def cmdline(pid: str) -> bytes:
        try:
            return (Path("/proc") / pid / "cmdline").read_bytes()
        except OSError:
            return b""

    def parent(pid: str) -> str:
        try:
            return (Path("/proc") / pid / "stat").read_text().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            return ""

    pids = [p.name for p in Path("/proc").iterdir() if p.name.isdigit()]
    replicas = {p for p in pids if b"EngineReplica" in cmdline(p)}
    return [int(p) for p in pids if parent(p) in replicas and b"spawn_main" in cmdline(p)]


def test_engine_killed_under_load_loses_no_batch_line_and_answers_no_500(
        base_url: str, client: Any, tmp_path: Path) -> None:
    src = tmp_path / "batch.jsonl"
    src.write_text("".join(json.dumps({
        "custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "m", "temperature": 0, "max_tokens": 12, "messages": [
            {"role": "system", "content": f"You work for team {i % 4}."},
            {"role": "user", "content": f"Line {i}: say something."}]}}) + "\n"
        for i in range(24)))
    uploaded = client.files.create(file=src.open("rb"), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    statuses: list[int] = []

    def chat(i: int) -> None:
        r = httpx.post(f"{base_url}/v1/chat/completions", timeout=300, json={
            "model": "m", "temperature": 0, "max_tokens": 24, "stream": i % 2 == 1,
            "messages": [{"role": "system", "content": f"You are assistant number {i}."},
                         {"role": "user", "content": "Tell me a short story."}]})
        statuses.append(r.status_code)

    threads = [threading.Thread(target=chat, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    victims = _engine_pids()
    assert len(victims) == 2
    os.kill(victims[0], signal.SIGKILL)
    for t in threads:
        t.join(timeout=300)
    assert statuses and all(s in (200, 503) for s in statuses), statuses

    deadline = time.monotonic() + 600
    while batch.status not in ("completed", "failed", "cancelled"):
        assert time.monotonic() < deadline
        time.sleep(1)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed"
    lines = client.files.content(batch.output_file_id).text.splitlines()
    ids = [json.loads(x)["custom_id"] for x in lines]
    assert sorted(ids) == sorted(f"b{i}" for i in range(24))  # each line exactly once

    # Ray starts a new replica (a new engine process) in place of the dead one.
    while True:
        assert time.monotonic() < deadline
        health = httpx.get(f"{base_url}/health", timeout=30).json()
        pids = _engine_pids()
        if health.get("replicas_ready") == 2 and len(pids) == 2 and victims[0] not in pids:
            break
        time.sleep(1)
