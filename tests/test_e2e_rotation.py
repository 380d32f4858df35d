"""The rotation of tests/test_server_e2e.py over schemas/ (tests/e2e_jobs.py; fast, no model): its
windows split the whole corpus but the ``hard`` schemas, none larger than the window size, so
consecutive runs cover every schema; the window follows the UTC day unless named."""

from __future__ import annotations

import json

import pytest
from e2e_jobs import (
    SCHEMA_CUT,
    SCHEMA_WINDOW,
    e2e_schemas,
    schema_corpus,
    schema_window,
    schema_windows,
)
from server_helpers import ROOT


def test_the_windows_split_the_whole_corpus() -> None:
    names = sorted(json.loads(p.read_text())["name"] for p in (ROOT / "schemas").glob("*.json")
                   if json.loads(p.read_text())["category"] != "hard")
    windows = schema_windows()
    flat = [i for w in windows for i in w]
    assert sorted(flat) == list(range(len(names))), "every schema in exactly one window"
    assert sorted(schema_corpus()[i]["name"] for i in flat) == names
    assert all(0 < len(w) <= SCHEMA_WINDOW for w in windows)
    assert len(windows) == -(-len(names) // SCHEMA_WINDOW) > 1
    assert set(SCHEMA_CUT) <= set(names), "a known cut names a schema of the corpus"


def test_the_window_rotates_by_day_unless_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRAMMARSERVE_E2E_WINDOW", raising=False)
    days = [86400 * d + 3600 for d in range(20000, 20016)]
    seen = []
    for t in days:
        monkeypatch.setattr("e2e_jobs.time.time", lambda t=t: t)
        seen.append(schema_window(8))
    assert seen == [d % 8 for d in range(20000, 20016)]
    monkeypatch.setenv("GRAMMARSERVE_E2E_WINDOW", "3")
    name, schemas = e2e_schemas()
    assert name == f"window3of{len(schema_windows())}"
    assert [i for i, _ in schemas] == schema_windows()[3]
    monkeypatch.setenv("GRAMMARSERVE_E2E_WINDOW", "99")
    with pytest.raises(ValueError, match="GRAMMARSERVE_E2E_WINDOW must be 0.."):
        e2e_schemas()
