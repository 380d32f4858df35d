"""Issue 33, crash containment: a native crash while a constraint compiles is that request's,
not the engine's. The crash journal (``fsm/crash_journal.py``) names the compiles running when
a process died; their constraints are refused from memory afterwards (a 400 to the request that
crashed the engine and to every identical one), and the death does not spend the restart budget
(``--engine-max-restarts 0`` below: one counted death would end the server).

The crashes are real: a child process aborts (SIGABRT) inside a journaled compile, or the test
plays the dying engine (journals a running request's constraint, as the engine does before each
compile, then kills the engine with SIGSEGV)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from grammarserve.errors import GrammarError
from grammarserve.fsm.config import GrammarSpec
from grammarserve.fsm.crash_journal import CRASHED_MESSAGE, CrashJournal, spec_digest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

SCHEMA = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"],
          "additionalProperties": False}
#: A reply that runs to ``max_tokens`` (the engine is killed while it decodes).
LONG = {"type": "object", "properties": {"story": {"type": "string", "minLength": 3000}},
        "required": ["story"], "additionalProperties": False}

_ABORT_IN_JOURNAL = r"""
import os, sys
from grammarserve.fsm.crash_journal import CrashJournal
with CrashJournal(sys.argv[1]).running(sys.argv[2]):
    os.abort()
"""


def test_a_compile_running_when_its_process_died_is_journaled(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", _ABORT_IN_JOURNAL, str(tmp_path), "d" * 32],
                          capture_output=True, timeout=120, check=False)
    assert proc.returncode == -signal.SIGABRT
    journal = CrashJournal(tmp_path)
    assert journal.collect() == ["d" * 32]
    assert journal.collect() == []  # moved, once
    assert journal.crashed() == frozenset({"d" * 32})
    with journal.running("e" * 32):
        pass
    assert journal.collect() == [] and journal.crashed() == frozenset({"d" * 32})


_CRASHING_COMPILE = r"""
import json, os, sys
from transformers import AutoTokenizer
from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.backends.llguidance_backend import LLGuidanceBackend
from grammarserve.models.loader import resolve_model_folder

real = LLGuidanceBackend.compile
def crash(self, spec, **kw):  # a native crash inside the backend's compile
    if "story" in spec.source:
        os.abort()
    return real(self, spec, **kw)
LLGuidanceBackend.compile = crash
tok = AutoTokenizer.from_pretrained(str(resolve_model_folder("default")))
compiler = GrammarCompiler(tok, crash_journal=sys.argv[1])
compiler.compile_json_schema({"type": "integer"})
print("first compiled", flush=True)
compiler.compile_json_schema(json.loads(sys.argv[2]))
print("unreachable", flush=True)
"""


@pytest.mark.model
def test_a_spec_that_crashed_a_compile_is_refused_from_memory(tokenizer: Any,
                                                               tmp_path: Path) -> None:
    from grammarserve.fsm import GrammarCompiler

    proc = subprocess.run([sys.executable, "-c", _CRASHING_COMPILE, str(tmp_path),
                           json.dumps(SCHEMA)], capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == -signal.SIGABRT, proc.stderr[-2000:]
    assert proc.stdout == "first compiled\n"
    spec = GrammarCompiler(tokenizer).spec("json_schema", SCHEMA)
    assert CrashJournal(tmp_path).collect() == [spec_digest(spec)]
    compiler = GrammarCompiler(tokenizer, crash_journal=str(tmp_path))
    with pytest.raises(GrammarError) as e:
        compiler.compile_json_schema(SCHEMA)
    assert str(e.value) == CRASHED_MESSAGE and e.value.path == "$"
    assert compiler.cache_stats().misses == 0  # refused before any backend ran
    compiler.compile_json_schema({"type": "object", "properties": {"other": {"type": "string"}}})


def _server_spec(schema: Any) -> GrammarSpec:
    """The spec the server's front end makes of ``response_format`` (its default options)."""
    from transformers import AutoTokenizer

    from grammarserve.config import EngineConfig
    from grammarserve.fsm import GrammarCompiler
    from grammarserve.models.loader import resolve_model_folder

    tok = AutoTokenizer.from_pretrained(str(resolve_model_folder("default")))
    options = {k: v for k, v in EngineConfig().grammar_options.items() if k != "crash_journal"}
    return GrammarCompiler(tok, **options).spec("json_schema", schema)


def _chat(schema: Any, max_tokens: int) -> dict[str, Any]:
    return {"model": "default", "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": "Tell me a very long story."}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "s", "schema": schema}}}


@pytest.mark.model
def test_an_engine_death_while_compiling_is_the_requests_not_the_servers(
        tmp_path: Path) -> None:
    from serverproc import ServerProcess, request

    data = tmp_path / "data"
    srv = ServerProcess(tmp_path / "server.log", "--data-dir", str(data),
                        "--kv-cache-tokens", "16384", "--engine-max-restarts", "0",
                        "--engine-restart-backoff", "0.2")
    srv.start()
    try:
        digest = spec_digest(_server_spec(LONG))
        url = srv.url + "/v1/chat/completions"
        box: list[tuple[int, Any]] = []
        worker = threading.Thread(target=lambda: box.append(request("POST", url,
                                                                    _chat(LONG, 4000))))
        worker.start()
        time.sleep(3.0)  # the request is decoding
        pid = srv.engine_pid()
        for _ in range(60):  # NOTE: /proc's children lists can miss a child for a moment
            if pid is not None:
                break
            time.sleep(0.5)
            pid = srv.engine_pid()
        assert pid is not None and not box, box
        running = data / "grammar-crashes" / "running"
        (running / f"{digest}.{pid}.1").write_text(digest)  # as the engine journals a compile
        os.kill(pid, signal.SIGSEGV)
        worker.join(300)
        status, body = box[0]
        assert status == 400, body
        assert CRASHED_MESSAGE in body["error"]["message"]
        assert srv.wait_healthy(300), "the server gave up: the death spent the budget"
        assert srv.proc is not None and srv.proc.poll() is None
        again = request("POST", url, _chat(LONG, 8))
        assert again[0] == 400 and CRASHED_MESSAGE in again[1]["error"]["message"]
        other = request("POST", url, _chat({"type": "object", "properties": {
            "n": {"type": "integer"}}, "required": ["n"]}, 16))
        assert other[0] == 200, other
        assert "compiling a constraint, which is refused" in (tmp_path / "server.log").read_text()
    finally:
        srv.stop()
