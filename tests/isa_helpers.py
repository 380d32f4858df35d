"""Test helper: which instruction-set builds of the C++ kernels a test may skip.

A kernel test skips an instruction set only when the CPU does not report it (or
``GRAMMARSERVE_CPU_ISA`` caps it away); when the CPU reports it and its build failed, the test
fails with the compiler's reason. (At run time :func:`grammarserve_kernels.quant_q8.cpu_isa` falls
back to the widest build that compiled, so a broken AVX-512 build would otherwise turn its tests
into skips on exactly the machines that should run them.)

What the CPU reports is read without any build: the ``flags`` of ``/proc/cpuinfo`` (Linux lists
AVX-512 there only when the OS enables its register state), else torch's CPU capability (no VNNI
level there).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from grammarserve_kernels import quant_q8

#: The cpuinfo flags each build needs, as ``gs_cpu_level`` in quant_q8_cpu.cpp checks them.
ISA_FLAGS = {"avx2": {"avx", "avx2", "fma"},
             "avx512": {"avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl"},
             "avx512vnni": {"avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl",
                            "avx512_vnni"}}


def reported_isas(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """The builds of :data:`quant_q8.ISAS` this CPU reports it runs (independent of whether they
    compile)."""
    try:
        flags = set(next((ln.split(":", 1)[1].split() for ln in cpuinfo.read_text().splitlines()
                          if ln.startswith("flags")), []))
    except OSError:
        cap = torch.backends.cpu.get_cpu_capability()
        return ["avx2", "avx512"] if cap == "AVX512" else ["avx2"] if cap == "AVX2" else []
    return [isa for isa in quant_q8.ISAS if ISA_FLAGS[isa] <= flags]


def capped_away(isa: str) -> bool:
    """Whether ``GRAMMARSERVE_CPU_ISA`` caps the builds below ``isa``."""
    cap = os.environ.get("GRAMMARSERVE_CPU_ISA")
    isas = quant_q8.ISAS
    return bool(cap) and cap in isas and isas.index(isa) > isas.index(cap)


def require_isa(isa: str) -> None:
    """Skip when this CPU does not report ``isa`` (or ``GRAMMARSERVE_CPU_ISA`` caps it away, or
    ``GRAMMARSERVE_QUANT_KERNEL=0`` turns the kernels off); fail when it does and the ``isa``
    build of the int8 kernel failed (the message is the compiler's reason). ``isa`` may be a
    prefix of that kernel's builds (``avx512`` for the attention kernel's)."""
    full = next(i for i in quant_q8.ISAS if i.startswith(isa))
    if full not in reported_isas():
        pytest.skip(f"this CPU does not report {full} (it reports {reported_isas()})")
    if capped_away(full):
        pytest.skip(f"GRAMMARSERVE_CPU_ISA={os.environ['GRAMMARSERVE_CPU_ISA']} leaves {full} out")
    if os.environ.get("GRAMMARSERVE_QUANT_KERNEL", "1") == "0":
        pytest.skip("GRAMMARSERVE_QUANT_KERNEL=0 turns the kernels off")
    if (error := quant_q8.kernel_error(full)) is not None:
        pytest.fail(f"this CPU reports {full} but its build failed: {error}", pytrace=False)
