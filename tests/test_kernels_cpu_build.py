"""cpu_build: a kernel is rebuilt when its source or a local header it includes changes; the one
cache of opened libraries (``open_cached``) builds, declares and refuses once per source and
tag; a build that fails for an instruction set the CPU reports fails that build's tests
(tests/isa_helpers.py), one the CPU lacks is skipped."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import isa_helpers
import pytest
from grammarserve_kernels import quant_q8
from grammarserve_kernels.cpu_build import build_and_open, build_error, open_cached

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")


def _value(lib: ctypes.CDLL) -> int:
    lib.value.restype = ctypes.c_int
    return int(lib.value())


def test_an_edited_local_header_is_a_new_build(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAMMARSERVE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "part.h").write_text("#pragma once\nconstexpr int kValue = 1;\n")
    src = tmp_path / "k.cpp"
    src.write_text('#include "part.h"\nextern "C" int value() { return kValue; }\n')
    flags = ["-O1", "-shared", "-fPIC", "-std=c++17"]
    assert _value(build_and_open(src, flags, tag="a")) == 1
    (tmp_path / "part.h").write_text("#pragma once\nconstexpr int kValue = 2;\n")
    assert _value(build_and_open(src, flags, tag="a")) == 2
    assert len(list((tmp_path / "cache" / "kernels").glob("k-a-*.so"))) == 2


def test_one_cache_opens_declares_and_refuses_once(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAMMARSERVE_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "once.cpp"
    src.write_text('extern "C" int value() { return 7; }\n')
    flags = ["-O1", "-shared", "-fPIC", "-std=c++17"]
    declared: list[ctypes.CDLL] = []
    lib = open_cached(src, flags, "a", declare=declared.append)
    assert lib is not None and _value(lib) == 7
    assert open_cached(src, flags, "a", declare=declared.append) is lib and declared == [lib]
    asked: list[str] = []

    def refuse() -> str:
        asked.append("b")
        return "disabled here"

    assert open_cached(src, flags, "b", refuse=refuse) is None
    assert open_cached(src, flags, "b", refuse=refuse) is None and asked == ["b"]
    assert build_error(src, "b") == "disabled here" and build_error(src, "a") is None
    bad = tmp_path / "bad.cpp"
    bad.write_text("this is not C++\n")
    assert open_cached(bad, flags, "a") is None
    assert (build_error(bad, "a") or "").startswith("cannot build bad.cpp for a: ")


#: Run in a fresh interpreter (no build opened yet): the CPU made to report every ISA, then the
#: gate of the kernel tests asked about one; prints how it ended.
_GATE = """
import sys
import pytest
sys.path.insert(0, sys.argv[1])
import isa_helpers
isa_helpers.reported_isas = lambda: list(isa_helpers.quant_q8.ISAS)
try:
    isa_helpers.require_isa(sys.argv[2])
except pytest.fail.Exception as e:
    print("failed:", e)
except pytest.skip.Exception as e:
    print("skipped:", e)
else:
    print("ran")
"""


@pytest.mark.parametrize(("isa", "flag"), [("avx512", "-mavx512f"),
                                           ("avx512vnni", "-mavx512vnni")])
def test_a_failed_build_of_an_isa_the_cpu_reports_fails_its_tests(
        tmp_path: Path, isa: str, flag: str) -> None:
    """Not a skip: at run time the kernel falls back to the AVX2 build, so a skip would hide a
    broken AVX-512 build on exactly the machines that run it. The compiler refuses that ISA's
    flag (a wrapper as ``$CXX``); a fresh kernel cache makes the build run."""
    cxx = tmp_path / "cxx"
    cxx.write_text(f'#!/bin/sh\nfor a in "$@"; do [ "$a" = "{flag}" ] && '
                   f'{{ echo "refusing {flag}" >&2; exit 1; }}; done\nexec c++ "$@"\n')
    cxx.chmod(0o755)
    env = {**os.environ, "CXX": str(cxx), "GRAMMARSERVE_CACHE": str(tmp_path / "cache")}
    for name in ("GRAMMARSERVE_CPU_ISA", "GRAMMARSERVE_QUANT_KERNEL"):
        env.pop(name, None)
    out = subprocess.run([sys.executable, "-c", _GATE, str(Path(__file__).parent), isa],
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.startswith(f"failed: this CPU reports {isa} but its build failed: "
                                 f"cannot build quant_q8_cpu.cpp for {isa}"), out
    assert f"refusing {flag}" in out.stdout  # the compiler's own words


def test_an_isa_the_cpu_does_not_report_is_a_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    """(Asked before any build: a CPU without the ISA never builds it.)"""
    monkeypatch.setattr(isa_helpers, "reported_isas", lambda: ["avx2"])
    monkeypatch.delenv("GRAMMARSERVE_CPU_ISA", raising=False)
    with pytest.raises(pytest.skip.Exception, match="this CPU does not report avx512vnni"):
        isa_helpers.require_isa("avx512vnni")
    monkeypatch.setenv("GRAMMARSERVE_CPU_ISA", "avx2")
    monkeypatch.setattr(isa_helpers, "reported_isas", lambda: list(quant_q8.ISAS))
    with pytest.raises(pytest.skip.Exception, match="GRAMMARSERVE_CPU_ISA=avx2 leaves avx512 out"):
        isa_helpers.require_isa("avx512")


def test_reported_isas_read_the_cpu_flags(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    base = "fpu avx avx2 fma"
    for flags, want in ((base, ["avx2"]), (f"{base} avx512f avx512bw avx512vl", ["avx2", "avx512"]),
                        (f"{base} avx512f avx512bw avx512vl avx512_vnni", list(quant_q8.ISAS)),
                        ("fpu avx", [])):
        info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: x\n")
        assert isa_helpers.reported_isas(info) == want, flags
