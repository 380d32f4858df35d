"""The soak's view of the server's memory (``soak.py``): :class:`Sampler` reads both processes'
resident memory and the restart counter from ``/metrics`` every ``--sample-s`` seconds, and
:class:`Scraper` does Prometheus-style scrapes (``--scrape-every S``): a thread that sends
``GET /metrics`` every ``S`` seconds with a 3 s client timeout, as a scraper would, and counts
the scrapes that were slow (over 1 s) or failed (no 200 within the timeout). Each answered
scrape adds the API and engine resident memory to the soak's RSS series.
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
    ``(seconds since t0, api MB, engine MB)`` go to ``series`` (shared with the soak's sampler:
    ``list.append`` is atomic)."""

    def __init__(self, base: str, every_s: float, series: list[tuple[float, float, float]],
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
        m = parse(text)
        if API_RSS in m:
            self.series.append((round(time.monotonic() - self.t0, 1),
                                round(m[API_RSS] / 2**20, 1),
                                round(m.get(ENGINE_RSS, 0.0) / 2**20, 1)))

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
    """RSS of both processes and the restart counter, every ``every_s`` seconds."""

    def __init__(self, base: str, every_s: float) -> None:
        super().__init__(daemon=True)
        self.base, self.every_s = base, every_s
        self.t0 = time.monotonic()
        self.series: list[tuple[float, float, float]] = []  # (s, api MB, engine MB)
        self.stop = threading.Event()

    def sample(self) -> dict[str, float]:
        m = metrics(self.base)
        if API_RSS in m:
            self.series.append((round(time.monotonic() - self.t0, 1),
                                round(m[API_RSS] / 2**20, 1),
                                round(m.get(ENGINE_RSS, 0.0) / 2**20, 1)))
        return m

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            self.sample()


def rss_summary(series: list[tuple[float, float, float]], col: int,
                warm_s: float) -> dict[str, Any]:
    """Start, value after the warm-up (``warm_s``), middle sample, end, max, growth after the
    warm-up and over the second half, of column ``col`` of ``series``."""
    vals = [row[col] for row in series if row[col] > 0]
    warm = [row[col] for row in series if row[0] >= warm_s and row[col] > 0]
    if not vals:
        return {}
    after = warm[0] if warm else vals[-1]
    mid = vals[len(vals) // 2]  # flat means the second half grows by ~nothing
    return {"start": vals[0], "after_warmup": after, "middle": mid, "end": vals[-1],
            "max": max(vals), "growth_after_warmup": round(vals[-1] - after, 1),
            "growth_second_half": round(vals[-1] - mid, 1)}


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
