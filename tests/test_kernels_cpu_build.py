"""cpu_build: a kernel is rebuilt when its source or a local header it includes changes."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import pytest
from grammarserve_kernels.cpu_build import build_and_open

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
