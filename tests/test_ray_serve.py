"""The Ray Serve application on a local Ray instance: 2 engine replicas of the embedded model
behind the OpenAI routes, used with the official ``openai`` SDK (needs ``grammarserve[ray]``)."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytestmark = pytest.mark.model

from prometheus_client.parser import text_string_to_metric_families
from ray_helpers import local_ray

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
    with local_ray():
        yield from _serve(tmp_path_factory)


def _serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    try:
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        config = RayServeConfig(ServerConfig(engine=EngineConfig(
                                    kv_cache_tokens=2048, num_threads=1,
                                    kv_disk_tier=str(tmp_path_factory.mktemp("kv"))),
                                             data_dir=tmp_path_factory.mktemp("data")),
                                replicas=2, health_period_s=2.0)
        serve.run(build_app(config), name=APP_NAME, route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        last: list[str] = [""]

        def both_ready() -> bool:
            try:
                r = httpx.get(f"{url}/health", timeout=30)
            except httpx.TransportError as e:  # the proxy may drop a connection as it starts
                last[0] = repr(e)
                return False
            last[0] = f"{r.status_code} {r.text[:300]}"
            return r.status_code == 200 and r.json().get("replicas_ready") == 2

        # generous: a loaded 2-core machine
        wait_until(both_ready, 600, "both replicas ready", interval_s=1,
                   detail=lambda: f"/health said {last[0]}")
        yield url
    finally:
        serve.shutdown()


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
    def counted() -> dict[str, float] | None:
        after = _served(base_url)
        gained = {r: after[r] - before.get(r, 0) for r in after}
        return gained if sum(gained.values()) >= 4 else None

    # a replica counts a request when its stream closes
    gained = wait_until(counted, 60, "the four requests counted", interval_s=0.5)
    assert len(gained) == 2
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


def _metric(base_url: str, name: str) -> float:
    """The ingress's value of the unlabelled sample ``name`` (0 where absent)."""
    text = httpx.get(f"{base_url}/metrics", timeout=60).text
    return next((s.value for family in text_string_to_metric_families(text)
                 for s in family.samples if s.name == name and not s.labels), 0.0)


@pytest.fixture(scope="module")
def replicas(base_url: str) -> Any:
    """A handle on the engine deployment (its broadcasts reach every replica)."""
    return serve.get_deployment_handle("EngineReplica", app_name=APP_NAME)


def _replica_counts(replicas: Any) -> dict[str, dict[str, Any]]:
    """Each replica's :meth:`EngineReplica.counts` by replica id (answers while an engine is
    stopped)."""
    return {c["replica"]: c for c in replicas.broadcast("counts").results(timeout_s=60)}


def _wait_for(what: str, done: Callable[[], bool], timeout: float = 300) -> None:
    wait_until(done, timeout, what, interval_s=0.2)


def _chat(base_url: str, system: str, stream: bool) -> tuple[int, str]:
    r = httpx.post(f"{base_url}/v1/chat/completions", timeout=300, json={
        "model": "m", "temperature": 0, "max_tokens": 24, "stream": stream,
        "messages": [{"role": "system", "content": system},
                     {"role": "user", "content": "Tell me a short story."}]})
    return r.status_code, r.text


def _check_reply(status: int, body: str, stream: bool) -> None:
    """A complete reply: 200, text, a finish reason (a stream: chunks, one finish, ``[DONE]``,
    no error event)."""
    assert status == 200, body[:500]
    if not stream:
        reply = json.loads(body)
        choice = reply["choices"][0]
        assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]
        assert choice["finish_reason"] in ("stop", "length")
        assert 0 < reply["usage"]["completion_tokens"] <= 24
        return
    events = [line[len("data: "):] for line in body.split("\n\n") if line]
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    assert not [c for c in chunks if "error" in c], chunks
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]
            and c["choices"][0]["finish_reason"]] in (["stop"], ["length"])


def _engine_stats(replicas: Any) -> dict[str, dict[str, Any]]:
    """Each live replica's engine counters (``EngineStats`` as a dict) by replica id."""
    return {s["replica"]: s["engine"]
            for s in replicas.broadcast("stats").results(timeout_s=60)}


def test_engine_killed_under_load_loses_no_batch_line_and_answers_no_500(
        base_url: str, client: Any, replicas: Any, tmp_path: Path) -> None:
    """An engine is stopped (SIGSTOP), so every request that reaches it from then on has no
    output; four chats sharing a prompt are held there (their home replica, under the router's
    queue threshold), a batch and four more chats start, then the engine is killed. Every chat
    must come back complete (the ingress sends each request its replica lost before any output
    once more, to the live replica: counted), every batch line exactly once, and Ray must start
    a new replica in place of the dead one. The replicas share one KV disk tier: the live
    replica, which never computed the shared prompt, restores its KV from the blocks the
    killed one wrote."""
    shared = "You are the night-shift assistant of a lighthouse on a rocky coast. " * 14
    before = _replica_counts(replicas)
    assert len(before) == 2
    client.chat.completions.create(model="m", temperature=0, max_tokens=1, messages=[
        {"role": "system", "content": shared}, {"role": "user", "content": "Hello."}])
    after = _replica_counts(replicas)
    (home,) = [r for r in after if after[r]["received"] > before[r]["received"]]
    victim = after[home]["engine_pid"]
    assert victim in _engine_pids()
    (other,) = [r for r in after if r != home]
    _wait_for("the shared prompt's KV blocks on disk", lambda: (
        _engine_stats(replicas)[home]["kv_disk_tier_writes"] >= 2))
    stats = _engine_stats(replicas)[other]
    from_disk = stats["kv_disk_hit_tokens"] + stats["kv_prefetched_tokens"]
    retried = _metric(base_url, "grammarserve_replica_retried_requests_total")

    src = tmp_path / "batch.jsonl"
    src.write_text("".join(json.dumps({
        "custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "m", "temperature": 0, "max_tokens": 12, "messages": [
            {"role": "system", "content": f"You work for team {i % 4}."},
            {"role": "user", "content": f"Line {i}: say something."}]}}) + "\n"
        for i in range(24)))
    uploaded = client.files.create(file=src.open("rb"), purpose="batch")
    outcomes: dict[int, tuple[int, str] | BaseException] = {}
    streams = {i: i % 2 == 1 for i in range(8)}

    def chat(i: int, system: str) -> None:
        try:
            outcomes[i] = _chat(base_url, system, streams[i])
        except BaseException as e:  # noqa: BLE001 - collected and asserted below
            outcomes[i] = e

    threads = [threading.Thread(target=chat, args=(i, shared)) for i in range(4)]
    threads += [threading.Thread(target=chat, args=(i, f"You are assistant number {i}."))
                for i in range(4, 8)]
    os.kill(victim, signal.SIGSTOP)
    try:
        for t in threads[:4]:
            t.start()
        _wait_for("the four shared-prompt chats at their home replica", lambda: (
            _replica_counts(replicas)[home]["received"] >= after[home]["received"] + 4))
        batch = client.batches.create(input_file_id=uploaded.id,
                                      endpoint="/v1/chat/completions", completion_window="24h")
        for t in threads[4:]:
            t.start()
        _wait_for("the batch past validation", lambda: client.batches.retrieve(
            batch.id).status != "validating")
    finally:
        os.kill(victim, signal.SIGKILL)  # a stopped process dies too
    for t in threads:
        t.join(timeout=300)
    assert sorted(outcomes) == list(range(8)), outcomes  # every thread ended
    for i, outcome in sorted(outcomes.items()):
        assert not isinstance(outcome, BaseException), (i, outcome)
        _check_reply(*outcome, stream=streams[i])
    # The four held requests at least were lost before their first output, and sent again.
    assert _metric(base_url, "grammarserve_replica_retried_requests_total") >= retried + 4

    _wait_for("the batch to end", lambda: client.batches.retrieve(batch.id).status in (
        "completed", "failed", "cancelled"), timeout=600)
    batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed"
    lines = client.files.content(batch.output_file_id).text.splitlines()
    records = [json.loads(x) for x in lines]
    assert sorted(r["custom_id"] for r in records) == sorted(f"b{i}" for i in range(24))
    for r in records:  # each line exactly once, each a complete reply
        assert r["response"]["status_code"] == 200, r
        assert r["response"]["body"]["choices"][0]["message"]["content"], r

    # Ray starts a new replica (a new engine process) in place of the dead one.
    _wait_for("a new replica", lambda: (
        httpx.get(f"{base_url}/health", timeout=30).json().get("replicas_ready") == 2
        and len(pids := _engine_pids()) == 2 and victim not in pids), timeout=600)
    counts = _replica_counts(replicas)
    assert len(counts) == 2 and home not in counts
    assert victim not in {c["engine_pid"] for c in counts.values()}
    # The held chats went to the live replica, which read the shared prompt's blocks from the
    # disk tier the killed engine wrote.
    live = _engine_stats(replicas)[other]
    assert live["kv_disk_hit_tokens"] + live["kv_prefetched_tokens"] >= from_disk + 128
