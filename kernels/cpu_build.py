"""Compile a kernel's C++ source with given flags into a per-(source, flags) cache file, and open
it with ctypes.

The cache folder is ``$GRAMMARSERVE_CACHE/kernels`` (else ``$XDG_CACHE_HOME/grammarserve/kernels``
or ``~/.cache/grammarserve/kernels``); the file name carries a hash of the source, the local
headers it includes (``avx_math.h``) and the flags, so an edited source or header or another
instruction set is a new file. Concurrent builders each write a temp file and rename it into
place.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import tempfile
from pathlib import Path


class KernelBuildError(OSError):
    """The compiler is missing or refused the source (the message is its last output)."""


def cache_dir() -> Path:
    """Where built kernels are kept."""
    if env := os.environ.get("GRAMMARSERVE_CACHE"):
        return Path(env) / "kernels"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "grammarserve" / "kernels"


def open_cached(source: Path, flags: list[str], tag: str, libs: dict[str, ctypes.CDLL],
                errors: dict[str, str]) -> ctypes.CDLL | None:
    """:func:`build_and_open` once per ``tag``: the library from ``libs``, or None with the reason
    kept in ``errors`` (a failed build is not retried)."""
    if tag in libs or tag in errors:
        return libs.get(tag)
    try:
        libs[tag] = build_and_open(source, flags, tag=tag)
    except OSError as e:
        errors[tag] = f"cannot build {source.name} for {tag}: {' '.join(str(e).split())[:300]}"
        return None
    return libs[tag]


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
