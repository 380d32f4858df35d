"""What machine a benchmark ran on, for its JSON line: every figure must say which CPU measured it
(the CPU model varies between machines of this project's kind: AVX2 only, AVX-512 with VNNI,
or with AMX too),
from which checkout and when. :func:`stamp` gives all three; every script of benchmarks/ that
prints a JSON result line starts the line with it (tests/test_bench_stamps.py checks that)."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path


def cpu_name() -> str:
    """``"<model name> (<N> cores, <widest vector ISA>)"`` from ``/proc/cpuinfo``."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine() or "unknown"
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines()
                 if ln.startswith("model name")), platform.machine() or "unknown")
    flags = set(next((ln.split(":", 1)[1].split() for ln in info.splitlines()
                      if ln.startswith("flags")), []))
    isa = ("AVX-512 VNNI" if {"avx512f", "avx512_vnni"} <= flags else
           "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2")
    if {"amx_tile", "amx_bf16"} <= flags:  # listed by the CPU; whether Linux grants the tiles
        isa += ", AMX"  # is the kernel report's ``amx`` (grammarserve_kernels.quant_panel)
    return f"{name} ({os.cpu_count()} cores, {isa})"


def revision() -> str:
    """``git describe --always --dirty`` of the checkout the benchmark runs from."""
    out = subprocess.run(["git", "describe", "--always", "--dirty"], check=False,
                         cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def stamp() -> dict[str, str]:
    """``{"git": revision(), "cpu": cpu_name(), "time": <local time, ISO 8601 with offset>}``,
    taken when called: the first keys of a benchmark's JSON result line
    (``{**stamp(), ...}``)."""
    return {"git": revision(), "cpu": cpu_name(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
