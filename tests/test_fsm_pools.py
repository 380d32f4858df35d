"""The grammar layer's background pools end with the compiler or the interpreter: no traceback
and no wait for queued upgrades at the end of a script (``grammarserve/fsm/pools.py``)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from grammarserve.fsm.pools import BackgroundPool, settled

ROOT = Path(__file__).resolve().parent.parent

# A script that compiles 100 schemas (each twice, so every upgrade is queued), leaves 100 more
# compiles in flight on the compile threads, and ends without closing anything.
_SCRIPT = """
import json, sys
from pathlib import Path
from grammarserve.fsm import GrammarCompiler
from grammarserve.models.loader import load_tokenizer, resolve_model_folder

compiler = GrammarCompiler(load_tokenizer(resolve_model_folder("default")))
files = sorted(Path(sys.argv[1]).glob("**/*.json"))[:200]
schemas = [json.loads(f.read_text()) for f in files]
done = 0
for schema in schemas[:100]:
    try:
        compiler.compile_json_schema(schema).matcher()
        compiler.compile_json_schema(schema).matcher()
        done += 1
    except Exception:
        pass
pending = [compiler.compile_async("json_schema", s) for s in schemas[100:]]
print(done, flush=True)
"""


@pytest.mark.model
def test_a_script_that_compiled_100_schemas_exits_without_a_traceback() -> None:
    run = subprocess.run([sys.executable, "-c", _SCRIPT, str(ROOT / "schemas")],
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert int(run.stdout.strip()) >= 90
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert "cannot schedule new futures" not in run.stderr


def test_a_closed_pool_cancels_queued_work_and_answers_none() -> None:
    pool = BackgroundPool(1, "test-pool")
    release = threading.Event()
    running = pool.submit(release.wait, 60)
    queued = pool.submit(lambda: "ran")
    assert running is not None and queued is not None
    pool.close()
    assert queued.cancelled()
    assert pool.submit(lambda: "late") is None
    release.set()
    assert running.result(timeout=60) is True  # the running item finishes on its own


def test_settled_holds_its_value() -> None:
    assert settled(False).result(timeout=0) is False


@pytest.mark.model
def test_a_closed_compiler_still_compiles_and_never_upgrades(tokenizer) -> None:  # type: ignore[no-untyped-def]
    from grammarserve.fsm import GrammarCompiler

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    with GrammarCompiler(tokenizer) as compiler:
        pass
    grammar = compiler.compile_json_schema(schema)
    grammar.matcher()
    upgrade = grammar.request_upgrade()
    assert upgrade is None or upgrade.result(timeout=60) is False
    matcher = compiler.compile_json_schema(schema).matcher()
    ids = tokenizer.encode('{"a": 7}', add_special_tokens=False)
    assert all(matcher.accept_token(t) for t in ids)
