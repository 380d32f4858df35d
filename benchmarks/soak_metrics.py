"""The soak's view of the server's memory (``soak.py``): :class:`Sampler` reads both processes'
resident memory and the restart counter from ``/metrics`` every ``--sample-s`` seconds, and
:class:`Scraper` does Prometheus-style scrapes (``--scrape-every S``): a thread that sends
``GET /metrics`` every ``S`` seconds with a 3 s client timeout, as a scraper would, and counts
the scrapes that were slow (over 1 s) or failed (no 200 within the timeout). Each answered
scrape adds a row to the soak's memory series (:data:`COLUMNS`): both processes' resident
memory, and the engine's parts that fill up to a bound (the host KV tier, the compiled grammars
held in memory) and its C heap's free-but-kept bytes; ``engine_net`` is the engine's RSS less
the two bounded caches, the part that must stay flat.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from typing import Any

from serverproc import metrics

#: A scraper's client timeout, and what counts as a slow scrape (seconds).
SCRAPE_TIMEOUT_S = 3.0
SLOW_S = 1.0
API_RSS = "process_resident_memory_bytes"
ENGINE_RSS = "grammarserve_engine_process_resident_memory_bytes"
HOST_TIER = "grammarserve_kv_host_tier_bytes"
GRAMMARS = "grammarserve_grammar_cache_bytes"
HEAP_FREE = "grammarserve_heap_free_held_bytes"
#: The memory series' columns after the first (seconds since the start), in MB.
COLUMNS = ("api", "engine", "host_tier", "grammar_cache", "heap_free_held", "engine_net")


def memory_row(m: dict[str, float], t: float) -> tuple[float, ...] | None:
    """One row of the series (seconds, then :data:`COLUMNS` in MB) from a scrape ``m``."""
    if API_RSS not in m:
        return None
    mb = [m.get(name, 0.0) / 2**20 for name in (API_RSS, ENGINE_RSS, HOST_TIER, GRAMMARS,
                                               HEAP_FREE)]
    net = mb[1] - mb[2] - mb[3] if mb[1] > 0 else 0.0
    return (round(t, 1), *(round(v, 1) for v in mb), round(net, 1))


def parse(text: str) -> dict[str, float]:
    """Prometheus text exposition as ``{name{labels}: value}`` (comments dropped)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                continue
    return out


class Scraper(threading.Thread):
    """Scrapes ``base``/metrics every ``every_s`` seconds until :attr:`stop` is set; rows
    (:func:`memory_row`) go to ``series`` (shared with the soak's sampler: ``list.append`` is
    atomic)."""

    def __init__(self, base: str, every_s: float, series: list[tuple[float, ...]],
                 t0: float) -> None:
        super().__init__(daemon=True)
        self.base, self.every_s, self.series, self.t0 = base, every_s, series, t0
        self.stop = threading.Event()
        self.scrapes = self.slow = self.failed = 0
        self.seconds: list[float] = []
        self.failures: list[str] = []  # the first few reasons

    def scrape(self) -> None:
        start = time.monotonic()
        try:
            with urllib.request.urlopen(self.base + "/metrics",
                                        timeout=SCRAPE_TIMEOUT_S) as r:
                text = r.read().decode("utf-8", "replace")
        except (OSError, urllib.error.URLError, ValueError) as e:
            self.scrapes += 1
            self.failed += 1
            if len(self.failures) < 5:
                self.failures.append(f"{type(e).__name__}: {e}"[:200])
            return
        took = time.monotonic() - start
        self.scrapes += 1
        self.seconds.append(took)
        self.slow += took > SLOW_S
        row = memory_row(parse(text), time.monotonic() - self.t0)
        if row is not None:
            self.series.append(row)

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            self.scrape()

    def report(self) -> dict[str, Any]:
        s = sorted(self.seconds)
        return {"every_s": self.every_s, "scrapes": self.scrapes, "slow_over_1s": self.slow,
                "failed": self.failed, "failures": self.failures,
                "p50_ms": round(1e3 * s[len(s) // 2], 1) if s else None,
                "max_ms": round(1e3 * s[-1], 1) if s else None}


class Sampler(threading.Thread):
    """The memory series (:func:`memory_row`) and the restart counter, every ``every_s``
    seconds."""

    def __init__(self, base: str, every_s: float) -> None:
        super().__init__(daemon=True)
        self.base, self.every_s = base, every_s
        self.t0 = time.monotonic()
        self.series: list[tuple[float, ...]] = []  # memory_row
        self.stop = threading.Event()

    def sample(self) -> dict[str, float]:
        m = metrics(self.base)
        row = memory_row(m, time.monotonic() - self.t0)
        if row is not None:
            self.series.append(row)
        return m

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            self.sample()


def rss_summary(series: list[tuple[float, ...]], col: int,
                warm_s: float) -> dict[str, Any]:
    """Start, value after the warm-up (``warm_s``), middle sample, end, max, growth after the
    warm-up and over the second half, of column ``col`` of ``series`` (rows where the column's
    process answered: the API's always, the engine's columns while its RSS was read)."""
    alive = 1 if col == 1 else 2
    rows = [row for row in series if row[alive] > 0]
    vals = [row[col] for row in rows]
    warm = [row[col] for row in rows if row[0] >= warm_s]
    if not vals:
        return {}
    after = warm[0] if warm else vals[-1]
    mid = vals[len(vals) // 2]  # flat means the second half grows by ~nothing
    return {"start": vals[0], "after_warmup": after, "middle": mid, "end": vals[-1],
            "max": max(vals), "growth_after_warmup": round(vals[-1] - after, 1),
            "growth_second_half": round(vals[-1] - mid, 1)}


def memory_report(series: list[tuple[float, ...]], warm_s: float) -> dict[str, Any]:
    """:func:`rss_summary` of every column of the series, by :data:`COLUMNS` name."""
    return {name: rss_summary(series, i + 1, warm_s) for i, name in enumerate(COLUMNS)}


def start_scraper(base: str, every_s: float, sampler: Sampler) -> Scraper | None:
    """Started scrapes every ``every_s`` seconds into ``sampler``'s series (none if 0)."""
    if every_s <= 0:
        return None
    scraper = Scraper(base, every_s, sampler.series, sampler.t0)
    scraper.start()
    return scraper


def scrapes_report(scraper: Scraper | None) -> dict[str, Any] | None:
    """Stop ``scraper`` and return its counts (None when there was none)."""
    if scraper is None:
        return None
    scraper.stop.set()
    scraper.join(10)
    return scraper.report()
