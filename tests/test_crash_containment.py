"""Crash containment: a native crash while a constraint compiles is that request's,
not the engine's. The crash journal (``fsm/crash_journal.py``) names the compiles running when
a process died; their constraints are refused from memory afterwards (a 400 to the request that
crashed the engine and to every identical one), and the death does not spend the restart budget
(``--engine-max-restarts 0`` below: one counted death would end the server).

The crashes are real: a child process aborts (SIGABRT) inside a journaled compile, or the test
signals the server's engine (SIGSEGV to the compiling thread: a native crash in the backend;
SIGKILL: an operator or the OOM killer) while a real compile runs (waiting for its journal entry)
or a long prompt is prefilled."""

from __future__ import annotations

import ctypes
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


#: A valid schema whose backend compile in the engine takes ~0.7 s on this model (long enough
#: to signal the engine while it runs: the test waits for its journal entry, then signals).
SLOW = {"type": "object", "required": [f"n{i}" for i in range(1000)],
        "properties": {f"n{i}": {"type": "integer", "minimum": -123456789 + i,
                                 "maximum": 987654321 - i} for i in range(1000)}}


def _wait_for_entry(running: Path, worker: threading.Thread) -> int:
    """Once a compile's journal entry exists (the engine is compiling), the kernel id of the
    thread compiling (the entry's name ends with it)."""
    while worker.is_alive():
        entries = list(running.iterdir()) if running.is_dir() else []
        if entries:
            return int(entries[0].name.rsplit(".", 1)[1])
        os.sched_yield()
    raise AssertionError("the request ended before its compile was journaled")


def _signal_thread(pid: int, tid: int, sig: signal.Signals) -> None:
    """``tgkill``: ``sig`` to one thread of ``pid``, as a fault in that thread raises it (a
    signal sent to the process could run a crash handler on another thread while the compile
    finishes)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(234, pid, tid, int(sig)) != 0:  # SYS_tgkill on x86_64
        raise OSError(ctypes.get_errno(), f"tgkill({pid}, {tid}, {sig})")


def _crash_server(tmp_path: Path) -> Any:
    from serverproc import ServerProcess

    srv = ServerProcess(tmp_path / "server.log", "--data-dir", str(tmp_path / "data"),
                        "--kv-cache-tokens", "16384", "--engine-max-restarts", "1",
                        "--engine-restart-backoff", "0.2", "--grammar-disk-cache",
                        str(tmp_path / "gcache"))
    srv.start()
    return srv


@pytest.mark.model
@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGKILL])
def test_an_engine_death_while_a_real_compile_runs(tmp_path: Path, sig: signal.Signals) -> None:
    """A native crash (SIGSEGV) while the constraint compiles is the request's: a 400, the
    constraint refused from then on, the death not counted. A kill (SIGKILL: an operator, the
    OOM killer) blames no one: the request gets a 503 and the same schema is served after."""
    from serverproc import metrics, request

    srv = _crash_server(tmp_path)
    try:
        url = srv.url + "/v1/chat/completions"
        pid = int(metrics(srv.url)["grammarserve_engine_pid"])
        box: list[tuple[int, Any]] = []
        worker = threading.Thread(target=lambda: box.append(request("POST", url,
                                                                    _chat(SLOW, 8))))
        worker.start()
        tid = _wait_for_entry(tmp_path / "data" / "grammar-crashes" / "running", worker)
        t0 = time.monotonic()
        _signal_thread(pid, tid, sig)
        worker.join(60)
        assert box and time.monotonic() - t0 < 30
        status, body = box[0]
        assert srv.wait_healthy(300), "the server gave up"
        again = request("POST", url, _chat(SLOW, 8))
        other = request("POST", url, _chat({"type": "object", "properties": {
            "n": {"type": "integer"}}, "required": ["n"]}, 16))
        assert other[0] == 200, other
        m = metrics(srv.url)
        assert m["grammarserve_engine_restarts_total"] == 1
        if sig == signal.SIGSEGV:
            assert status == 400 and CRASHED_MESSAGE in body["error"]["message"], body
            assert again[0] == 400 and CRASHED_MESSAGE in again[1]["error"]["message"]
            assert m["grammarserve_engine_request_crashes_total"] == 1
            assert "compiling a constraint, which is refused" in (
                tmp_path / "server.log").read_text()
        else:
            assert status == 503, body
            assert again[0] == 200, again
            assert again[1]["choices"][0]["finish_reason"] == "length"  # 8 tokens: cut
            assert m["grammarserve_engine_request_crashes_total"] == 0
    finally:
        srv.stop()


@pytest.mark.model
def test_a_kill_during_a_long_prefill_answers_the_request(tmp_path: Path) -> None:
    from serverproc import metrics, request

    srv = _crash_server(tmp_path)
    try:
        url = srv.url + "/v1/chat/completions"
        pid = int(metrics(srv.url)["grammarserve_engine_pid"])
        long_prompt = {"model": "default", "max_tokens": 8, "messages": [
            {"role": "user", "content": "Summarise: " + "the cat sat on the mat. " * 900}]}
        box: list[tuple[int, Any]] = []
        worker = threading.Thread(target=lambda: box.append(request("POST", url, long_prompt)))
        worker.start()
        # the engine publishes its counters after each step: a running request with no output
        # yet is one whose prompt is being prefilled in chunks
        while worker.is_alive() and not metrics(srv.url).get("grammarserve_running_requests"):
            os.sched_yield()
        assert worker.is_alive(), box
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        worker.join(60)
        assert box and box[0][0] == 503 and time.monotonic() - t0 < 30, box
        assert srv.wait_healthy(300)
        assert request("POST", url, long_prompt)[0] == 200
    finally:
        srv.stop()
