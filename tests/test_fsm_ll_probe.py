"""llguidance's probe (``backends/ll_probe.py``): a large grammar built first in a child process,
killed at the compile timeout and bounded in memory, so a build past either never reaches the
engine; the child is replaced after it is killed."""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from grammarserve.constraints import ConstraintKind
from grammarserve.errors import GrammarError, GrammarTimeoutError
from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.backends.ll_probe import LLProbe
from grammarserve.fsm.backends.ll_tokenizer import hf_tokenizer_json
from grammarserve.fsm.config import GrammarSpec, canonical_json
from grammarserve.fsm.deadlines import Deadline
from grammarserve.fsm.limits import GrammarLimits
from grammarserve.fsm.structural_tag import TagChecks, normalize_structural_tag

pytestmark = pytest.mark.model

OBJ = {"type": "object", "properties": {"a": {"type": "string"}}}


def _legacy(n: int, triggers: int | None = None) -> dict[str, Any]:
    """A legacy structural tag of ``n`` structures, one trigger each (or one ``<`` for all)."""
    return {"type": "structural_tag",
            "triggers": [f"<f{i}>" for i in range(n)] if triggers is None else ["<"],
            "structures": [{"begin": f"<f{i}>", "schema": OBJ, "end": f"</f{i}>"}
                           for i in range(n)]}


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


UNBOUNDED = GrammarLimits(max_triggers=10**6, max_tags=10**6, max_backend_grammar_bytes=2**30)


def _unbounded_tag_spec(compiler: GrammarCompiler, n: int) -> GrammarSpec:
    """The spec of an ``n``-trigger structural tag, past the front end's bounds (a tag the
    front end would refuse, to reach the backend's own bounds)."""
    small = compiler.spec(ConstraintKind.STRUCTURAL_TAG, _legacy(1))
    checks = TagChecks(schema=lambda s, p: s, regex=lambda s, p: s, grammar=lambda s, p: s)
    tree = normalize_structural_tag(_legacy(n), checks, 64, UNBOUNDED)
    return replace(small, source=canonical_json(tree))


def test_a_timed_out_llguidance_build_is_killed_and_its_memory_never_reaches_the_engine(
        tokenizer: Any) -> None:
    with GrammarCompiler(tokenizer, background_upgrade=False, limits=UNBOUNDED,
                         compile_timeout_s=1.0) as compiler:
        compiler.warmup()  # NOTE: the backend built outside the 1 s compiles
        backend = compiler.policy.backend("llguidance")
        probe = backend.probe  # type: ignore[attr-defined]
        assert probe.check('start: "a"\n', 30) is None  # NOTE: its child, started
        child = probe.pid
        base = _rss_mb()
        # NOTE: a 5 MB grammar (the triggers exclude each other): in the engine it grew past
        # 1.3 GB at 1,000 triggers; here it never reaches the engine's llguidance
        spec = _unbounded_tag_spec(compiler, 600)
        with pytest.raises(GrammarError, match="timeout"):
            compiler.compile_spec_async(spec).result(30)
        compiler.cache.close(timeout_s=60)  # NOTE: waits for the written-off compile thread
        assert _rss_mb() - base < 300  # the grammar's text, not its build
        assert probe.pid in (None, child)  # killed at the deadline, or never asked past it
        # the build itself, given half a second: the child is killed and a new one serves
        compact = spec.with_option("json_style", "compact")
        text = backend.grammar_text(compact)  # type: ignore[attr-defined]
        if probe.pid is None:
            assert probe.check('start: "a"\n', 30) is None
        child = probe.pid
        with pytest.raises(GrammarError, match=r"compile timeout \(compile_timeout_s"):
            probe.check(text, 0.5)
        assert probe.pid is None and not Path(f"/proc/{child}").exists()
        assert probe.check('start: "b"\n', 30) is None and probe.pid not in (None, child)
        probe.close()


def test_an_llguidance_build_over_its_memory_is_refused(tokenizer: Any) -> None:
    limits = replace(UNBOUNDED, probe_memory_bytes=256 * 2**20)
    with GrammarCompiler(tokenizer, background_upgrade=False, limits=limits,
                         compile_timeout_s=60) as compiler:
        with pytest.raises(GrammarError, match=r"probe_memory_bytes"):
            compiler.compile_spec_async(_unbounded_tag_spec(compiler, 600)).result(60)
        probe = compiler.policy.backend("llguidance").probe  # type: ignore[attr-defined]
        assert probe.pid is None
        # NOTE: a grammar within the bounds is probed in a fresh child and compiles
        assert compiler.compile_structural_tag(_legacy(300, triggers=1)).backend == "llguidance"
        assert probe.pid is not None
        probe.close()
        compiler.cache.close()


def test_a_refusal_comes_back_and_a_dropped_probe_takes_its_child(tokenizer: Any) -> None:
    probe = LLProbe(lambda: {"tokenizer": hf_tokenizer_json(tokenizer), "n_vocab": len(tokenizer),
                             "eos": [tokenizer.eos_token_id], "limits": {}}, 2**31)
    assert probe.check('start: "a"\n', 30) is None
    refusal = probe.check("start: /[/\n", 30)
    assert refusal is not None and "invalid regex" in refusal
    child = probe.pid
    assert child is not None
    del probe
    gc.collect()
    assert not Path(f"/proc/{child}").exists()


def test_a_build_nobody_waits_for_stops(tokenizer: Any) -> None:
    with GrammarCompiler(tokenizer, background_upgrade=False, limits=UNBOUNDED,
                         compile_timeout_s=60) as compiler:
        compiler.warmup()
        backend = compiler.policy.backend("llguidance")
        probe = backend.probe  # type: ignore[attr-defined]
        spec = _unbounded_tag_spec(compiler, 600).with_option("json_style", "compact")
        text = backend.grammar_text(spec)  # type: ignore[attr-defined]
        assert probe.check('start: "a"\n', 30) is None
        child = probe.pid
        due = Deadline(time.monotonic() + 60)
        outcome: list[BaseException] = []

        def build() -> None:
            try:
                probe.check(text, due)
            except GrammarError as e:
                outcome.append(e)

        worker = threading.Thread(target=build)
        worker.start()
        due.at = float("-inf")  # NOTE: what GrammarCache.abandon does to a running compile
        start = time.monotonic()
        worker.join(30)
        assert time.monotonic() - start < 5  # the build took several seconds on its own
        assert len(outcome) == 1 and isinstance(outcome[0], GrammarTimeoutError)
        assert probe.pid in (None, child)  # killed mid-build, or never asked
        probe.close()
        compiler.cache.close()
