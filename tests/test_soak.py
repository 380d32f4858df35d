"""A short soak (benchmarks/soak.py): the bad-input corpus plus valid traffic, two rounds against
the real server. No 5xx, no connection dropped, no engine death, every valid request answered,
every batch line once, the resident memory of both processes about flat after the warm-up
round (bounded generously: the suite runs beside other work), and every /metrics scrape
answered while it runs."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from serverproc import ServerProcess
from soak import soak
from soak_corpus import cases

pytestmark = pytest.mark.model

#: RSS growth (MB) allowed from the end of the warm-up round to the end.
API_GROWTH_MB = 256
ENGINE_GROWTH_MB = 512


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("soak")
    srv = ServerProcess(tmp / "server.log", "--data-dir", str(tmp / "data"),
                        "--kv-cache-tokens", "16384", "--max-num-reqs", "8")
    srv.start()
    try:
        out = soak(srv.url, rounds=2, workers=3, sample_s=5.0, scrape_s=0.5)
        out["server_alive"] = srv.proc is not None and srv.proc.poll() is None
        yield out
    finally:
        srv.stop()


def test_no_5xx_and_no_dropped_connection(report: dict[str, Any]) -> None:
    bad = {k: v for k, v in report["unexpected_examples"].items()
           if k.endswith(":0") or k.split(":")[-1].startswith("5")}
    assert report["5xx"] == 0 and report["connection_errors"] == 0, bad


def test_engine_never_died(report: dict[str, Any]) -> None:
    assert report["server_alive"] and report["engine_restarts"] == 0


def test_valid_traffic_is_served(report: dict[str, Any]) -> None:
    valid = {c.name for c in cases() if c.valid}
    assert not [k for k in report["unexpected"] if k.split(":")[0] in valid], report["unexpected"]
    assert report["batch"]["batches"] == report["rounds"] == 2
    assert report["batch"]["every_line_once"] == 2, report["batch"]


def test_memory_is_about_flat_after_warm_up(report: dict[str, Any]) -> None:
    api, engine = report["rss_mb"]["api"], report["rss_mb"]["engine"]
    assert api["growth_after_warmup"] < API_GROWTH_MB, report["rss_series_mb"]
    assert engine["growth_after_warmup"] < ENGINE_GROWTH_MB, report["rss_series_mb"]


def test_metrics_scrapes_are_answered_during_the_soak(report: dict[str, Any]) -> None:
    """A Prometheus-style scraper (GET /metrics every 0.5 s, 3 s client timeout) is answered
    every time while the corpus runs, and its samples hold both processes' resident memory
    and the engine's bounded caches (soak_metrics.COLUMNS)."""
    scrapes = report["scrapes"]
    assert scrapes["scrapes"] >= 3 and scrapes["failed"] == 0, scrapes
    series = report["rss_series_mb"]
    assert series and all(len(row) == 7 for row in series)
    assert all(api > 0 and engine > 0 for _, api, engine, *_ in series)
    # engine_net is the RSS less the host tier and the compiled grammars
    assert all(abs(net - (engine - tier - grammars)) < 0.5
               for _, _, engine, tier, grammars, _, net in series)
    assert any(grammars > 0 for *_, grammars, _, _ in series)
