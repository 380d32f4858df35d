"""Compile a kernel's C++ source with given flags into a per-(source, flags) cache file, and open
it with ctypes.

The cache folder is ``$GRAMMARSERVE_CACHE/kernels`` (else ``$XDG_CACHE_HOME/grammarserve/kernels``
or ``~/.cache/grammarserve/kernels``); the file name carries a hash of the source, the local
headers it includes (``avx_math.h``) and the flags, so an edited source or header or another
instruction set is a new file. Concurrent builders each write a temp file and rename it into
place. :func:`open_cached` is the one cache of the opened libraries, every kernel's.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path


class KernelBuildError(OSError):
    """The compiler is missing or refused the source (the message is its last output)."""


def cache_dir() -> Path:
    """Where built kernels are kept."""
    if env := os.environ.get("GRAMMARSERVE_CACHE"):
        return Path(env) / "kernels"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "grammarserve" / "kernels"


#: The one cache of kernel libraries, by ``(source, tag)``: each is built and opened once per
#: process, and a build that failed (or was refused) is not retried; its reason stays here.
_LIBS: dict[tuple[Path, str], ctypes.CDLL] = {}
_ERRORS: dict[tuple[Path, str], str] = {}


def open_cached(source: Path, flags: list[str], tag: str = "", *,
                declare: Callable[[ctypes.CDLL], None] | None = None,
                refuse: Callable[[], str | None] | None = None) -> ctypes.CDLL | None:
    """The library of ``source`` built with ``flags`` for ``tag`` (:func:`build_and_open`),
    once per ``(source, tag)``: ``declare`` sets its functions' ``argtypes`` before anyone gets
    it. None where it cannot be had, with the reason for :func:`build_error`: ``refuse``'s (asked
    once, before building: an environment switch, a CPU without the instruction set), or the
    build's own."""
    key = (source, tag)
    lib = _LIBS.get(key)
    if lib is not None or key in _ERRORS:
        return lib
    why = refuse() if refuse is not None else None
    if why is not None:
        _ERRORS[key] = why
        return None
    try:
        lib = build_and_open(source, flags, tag=tag)
    except OSError as e:
        target = f" for {tag}" if tag else ""
        _ERRORS[key] = f"cannot build {source.name}{target}: {' '.join(str(e).split())[:300]}"
        return None
    if declare is not None:
        declare(lib)
    _LIBS[key] = lib
    return lib


def build_error(source: Path, tag: str = "") -> str | None:
    """Why :func:`open_cached` of ``(source, tag)`` gave None (None: it did not, or was not
    asked yet)."""
    return _ERRORS.get((source, tag))


def _local_headers(source: Path) -> bytes:
    """The bytes of the headers ``source`` includes from its own folder (``#include "x.h"``),
    so an edited shared header is a new build too."""
    names = re.findall(rb'^#include "([^"]+)"', source.read_bytes(), flags=re.MULTILINE)
    return b"".join((source.parent / n.decode()).read_bytes() for n in names
                    if (source.parent / n.decode()).is_file())


def build_and_open(source: Path, flags: list[str], tag: str = "") -> ctypes.CDLL:
    """The shared library built from ``source`` with ``flags`` (``$CXX``, default ``c++``)."""
    text = source.read_bytes() + _local_headers(source)
    digest = hashlib.sha256(text + " ".join(flags).encode()).hexdigest()[:16]
    target = cache_dir() / f"{source.stem}{'-' + tag if tag else ''}-{digest}.so"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        cxx = os.environ.get("CXX", "c++")
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            subprocess.run([cxx, *flags, str(source), "-o", tmp], check=True,
                           capture_output=True, timeout=300)
            os.replace(tmp, target)  # atomic: concurrent builders leave one complete file
        except subprocess.CalledProcessError as e:
            raise KernelBuildError(e.stderr.decode(errors="replace")[-300:]) from None
        except (OSError, subprocess.SubprocessError) as e:
            raise KernelBuildError(str(e)) from None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return ctypes.CDLL(str(target))
