"""What the grammar layer survives is logged and counted, never swallowed
(``grammarserve/fsm/failures.py``): a failed background upgrade, a grammar the disk cache could
not take, a jump-forward span that failed, a schema whose ids could not be read; the counts reach
``EngineStats`` (``engine/stats.py``), and a failure that repeats is logged once a minute."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from grammarserve.engine.stats import EngineStats, failure_fields
from grammarserve.errors import GrammarError
from grammarserve.fsm import GrammarCompiler
from grammarserve.fsm.failures import FAILURES, Failure, FailureCounts, FailureLog
from grammarserve.fsm.schema.read.localrefs import localize_refs

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
          "additionalProperties": False}


@pytest.fixture(autouse=True)
def _fresh_failure_log() -> None:
    FAILURES.reset()  # NOTE: no record held back by an earlier test's rate limit


@pytest.fixture(scope="module")
def byte_tokenizer() -> Any:
    from tiny_models import eos_byte_tokenizer

    return eos_byte_tokenizer()


def _records(caplog: pytest.LogCaptureFixture, logger: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger]


@pytest.mark.parametrize(("error", "level"), [(RuntimeError("backend bug"), logging.WARNING),
                                              (GrammarError("too big"), logging.INFO)])
def test_a_failed_upgrade_is_logged_and_counted(byte_tokenizer: Any, error: Exception,
                                                level: int, monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    with GrammarCompiler(byte_tokenizer, json_style="compact") as compiler:
        xgrammar = compiler.policy.backend("xgrammar")

        def fail(*args: Any, **kwargs: Any) -> Any:
            raise error

        monkeypatch.setattr(xgrammar, "compile", fail)
        grammar = compiler.compile_json_schema(SCHEMA)
        assert grammar.backend == "llguidance"
        with caplog.at_level(logging.INFO, logger="grammarserve.fsm.policy"):
            upgrade = grammar.request_upgrade()
            assert upgrade is not None and upgrade.result(timeout=60) is False
        assert grammar.backend == "llguidance"  # still served, by its first backend
    assert FAILURES.counts() == FailureCounts(upgrade=1)
    [record] = _records(caplog, "grammarserve.fsm.policy")
    assert record.levelno == level
    assert "the background xgrammar upgrade of a json_schema grammar failed" in \
        record.getMessage()
    assert (record.exc_info is not None) == (level == logging.WARNING)  # a bug's traceback


def test_a_grammar_the_disk_cache_cannot_take_is_logged_and_counted(
        byte_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    with GrammarCompiler(byte_tokenizer, json_style="compact",
                         disk_cache_dir=str(tmp_path)) as compiler:
        xgrammar = compiler.policy.backend("xgrammar")

        def fail(grammar: Any) -> str:
            raise ValueError("cannot serialize")

        monkeypatch.setattr(xgrammar, "serialize", fail)
        grammar = compiler.compile_json_schema(SCHEMA)
        with caplog.at_level(logging.INFO, logger="grammarserve.fsm.policy"):
            upgrade = grammar.request_upgrade()
            assert upgrade is not None
            assert upgrade.result(timeout=60) is True  # the upgrade itself went through
            compiler.flush_disk_writes()
    assert FAILURES.counts() == FailureCounts(disk_write=1)
    [record] = _records(caplog, "grammarserve.fsm.policy")
    assert record.levelno == logging.WARNING and "disk cache" in record.getMessage()


def test_a_failed_forced_span_is_logged_once_and_counted_each_time(
        byte_tokenizer: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    with GrammarCompiler(byte_tokenizer, json_style="compact",
                         background_upgrade=False) as compiler:
        matcher = compiler.compile_json_schema(SCHEMA).matcher()

    def fail() -> list[int]:
        raise RuntimeError("backend bug")

    monkeypatch.setattr(matcher, "_forced", fail)
    with caplog.at_level(logging.INFO, logger="grammarserve.fsm.matcher"):
        assert [matcher.forced_tokens() for _ in range(5)] == [[]] * 5
    assert not matcher.is_error()  # jump-forward is an optimization: the matcher goes on
    assert FAILURES.counts() == FailureCounts(forced_tokens=5)
    [record] = _records(caplog, "grammarserve.fsm.matcher")
    assert record.levelno == logging.WARNING and record.exc_info is not None


def test_a_schema_whose_ids_cannot_be_read_is_logged_and_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    schema = {"$defs": {"a": {"$id": 5}}, "$ref": "#/$defs/a", "$anchor": "x"}
    with caplog.at_level(logging.INFO, logger="grammarserve.fsm.schema.read.localrefs"):
        out = localize_refs(schema)
    assert out["$ref"] == "#/$defs/a"  # left to the front end
    assert FAILURES.counts() == FailureCounts(local_refs=1)
    [record] = _records(caplog, "grammarserve.fsm.schema.read.localrefs")
    assert record.levelno == logging.INFO
    assert "a schema's ids could not be read (AttributeError" in record.getMessage()


def test_a_repeated_failure_is_logged_once_per_interval_with_the_count_left_out(
        caplog: pytest.LogCaptureFixture) -> None:
    failures = FailureLog(interval_s=0.0)
    quiet = FailureLog(interval_s=3600.0)
    logger = logging.getLogger("grammarserve.test.failures")
    with caplog.at_level(logging.INFO, logger=logger.name):
        for _ in range(3):
            quiet.report(Failure.UPGRADE, logger, logging.INFO, "upgrade %s failed", "x")
        quiet.report(Failure.UPGRADE, logger, logging.INFO, "another message")
        failures.report(Failure.JOURNAL, logger, logging.INFO, "journal")
    assert [r.getMessage() for r in caplog.records] == ["upgrade x failed", "another message",
                                                        "journal"]
    assert quiet.counts() == FailureCounts(upgrade=4)
    quiet.interval_s = 0.0
    with caplog.at_level(logging.INFO, logger=logger.name):
        quiet.report(Failure.UPGRADE, logger, logging.INFO, "upgrade %s failed", "y")
    assert caplog.records[-1].getMessage() == \
        "upgrade y failed (2 more since the last such record)"


def test_the_counts_reach_the_engine_stats() -> None:
    counts = FailureCounts(upgrade=1, disk_write=2, forced_tokens=3, local_refs=4, journal=5)
    stats = EngineStats(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, **failure_fields(counts))
    assert (stats.grammar_upgrade_failures, stats.grammar_disk_write_failures,
            stats.grammar_forced_token_failures, stats.grammar_schema_id_failures,
            stats.grammar_journal_failures) == (1, 2, 3, 4, 5)
