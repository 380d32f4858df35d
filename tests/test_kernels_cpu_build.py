"""cpu_build: a kernel is rebuilt when its source or a local header it includes changes; the one
cache of opened libraries (``open_cached``) builds, declares and refuses once per source and
tag."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import pytest
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
