"""A real model shape (SmolLM2-360M's, random weights, benchmarks/model_shapes.py) served with no
memory flags: the server starts, logs its memory plan in one line, reports it in /metrics and
serves a ~750-token prompt. The 1.7B and Llama-3.2-1B shapes: benchmarks/bench_memory_plan.py
(benchmarks/README.md)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

from bench_memory_plan import prompt
from model_shapes import default_dir, make_gguf
from serverproc import ServerProcess, metrics, request


def test_a_real_shape_starts_with_the_defaults_and_serves(tmp_path: Path) -> None:
    gguf = make_gguf("smollm2-360m", default_dir())  # cached after the first run
    log = tmp_path / "serve.log"
    server = ServerProcess(log, "--model", str(gguf), "--log-level", "info",
                           "--num-threads", "2")
    server.start(timeout=600)
    try:
        status, body = request("POST", server.url + "/v1/completions", {
            "model": request("GET", server.url + "/v1/models")[1]["data"][0]["id"],
            "prompt": prompt(0, 700), "max_tokens": 4, "temperature": 0})
        m = metrics(server.url)
    finally:
        server.stop()
    assert status == 200, body
    assert body["usage"]["prompt_tokens"] > 500
    lines = [ln for ln in log.read_text().splitlines() if "grammarserve ready" in ln]
    assert len(lines) == 1 and "memory plan: cpu: weights" in lines[0], log.read_text()[-2000:]
    found = re.search(r"KV pool (\d+) tokens (\d+) MiB, decode mirror (\d+) tokens", lines[0])
    assert found is not None, lines[0]
    # NOTE: the pool follows the memory free now (a shared machine: as little as 2 GB left)
    assert int(found.group(1)) == m["grammarserve_kv_capacity"] > body["usage"]["prompt_tokens"]
    assert m["grammarserve_kv_mirror_tokens"] == int(found.group(3)) > 0
    # one copy: the GGUF's blocks in kernel layouts (Q4_1's x16 layout: 6 bits a weight for the
    # file's 5; its Q8_0 embedding as is), no fp32 copy beside them
    size = gguf.stat().st_size
    assert 0.8 * size < m["grammarserve_memory_weights_bytes"] < 1.5 * size
    planned = sum(m[f"grammarserve_{k}"] for k in (
        "kv_pool_bytes", "kv_host_tier_limit_bytes", "memory_activation_bytes")) + \
        m["grammarserve_kv_mirror_tokens"] * m["grammarserve_kv_pool_bytes"] / \
        m["grammarserve_kv_capacity"]
    assert planned <= m["grammarserve_memory_available_bytes"]
