"""Prefill GEMMs over x16-layout weights (``quant_q8.PackedWeight``) through torch's dense GEMM:
each weight is dequantized on the fly, a panel of rows at a time, into a dense bf16 (or fp32)
buffer by ``quant_panel_cpu.cpp`` and multiplied with ``torch.nn.functional.linear`` (oneDNN: AMX
tiles where the CPU has them, AVX-512 BF16 otherwise). One copy of the weights (the blocks) serves
both decode (the int8 kernel of ``quant_q8.py``) and prefill (here).

Numerics (``benchmarks/bench_prefill_gemm.py``, relative Frobenius error against the float64
product of the exact weights): the fp32 panel is the exact dequantized weight (:func:`dequantize_x16`
equals ``quant.dequantize`` bit for bit), so ``dtype=torch.float32`` is an fp32 GEMM of the true
weights (~2.5e-7). The bf16 path rounds the activations, the weights and the output to bf16
(8-bit mantissas; torch's bf16 GEMM has no fp32 output on CPU): 0.29%, between the int8 kernel's
one level (0.53%) and two (0.0021%). A row's result therefore depends on which path its batch
takes.

Speed (same benchmark, one thread of the AMD EPYC with AVX-512 VNNI and BF16, no AMX): bf16 panels
reach torch's dense bf16 rate (~150-180 GOP/s a core) from ~256 rows, about the two-level int8
kernel's rate (~140-170) and below the one-level one (~200-300); the dequantization is ~47% of the
panel time at 16 rows, ~12% at 256, ~2% at 2048. The gain is for CPUs whose bf16 GEMM outruns
VNNI (AMX).

The source is built once per instruction set (``avx2``, ``avx512``): a weight's panels come from
the build of its ``isa`` (``pack_x16`` picks it from ``quant_q8.cpu_isa``); never
``-march=native``.
"""

from __future__ import annotations

import ctypes
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from grammarserve_kernels.cpu_build import build_error, open_cached
from grammarserve_kernels.quant import QuantWeight
from grammarserve_kernels.quant_q8 import (
    KINDS,
    TILE,
    PackedWeight,
    check_segments,
    cpu_isa,
    pack_x16,
)

_SOURCE = Path(__file__).with_name("quant_panel_cpu.cpp")
_COMMON = ["-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-mavx2", "-mfma",
           "-ffp-contract=off"]  # Q4_1's d * q + m rounds twice, as quant.dequantize does
_ISA_FLAGS = {
    "avx2": [],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"],
}
#: Weight rows dequantized per panel: a 1024 x 2048 bf16 panel is 4 MiB. In
#: ``bench_prefill_gemm.py`` (gate_up, 16384 x 2048, AMD EPYC without AMX) panels of 256 to
#: 1024 rows and the whole segment ran within noise; with AMX (Intel Xeon, 2 threads) each
#: panel's output copy into the fp32 result costs about as much as its GEMM, and a 632-token
#: chunk at the 1.7B shape took 5.6 s with 512-row panels, 3.3 s with 2048 and 4.5 s with the
#: whole segment (a 235 MB transient for an 8B model's gate_up); a 2,680-token prompt
#: 14.4 / 10.8 / 11.1 s with 512 / 1024 / 2048 rows.
PANEL_ROWS = 1024
#: The batch rows from which :func:`panel_matmul` (bf16) ran at least as fast as the two-level
#: int8 kernel on the AMD EPYC (AVX-512 VNNI and BF16, no AMX) of ``bench_prefill_gemm.py``; with
#: AMX (oneDNN's bf16 tiles) the crossover is expected lower (measure with
#: :func:`measure_panel_gops`).
PANEL_MIN_ROWS = 256
_DTYPES = (torch.bfloat16, torch.float32)
#: The x16 kinds the dequantizing kernel reads -> its kind code.
PANEL_KINDS = {"Q8_0": 0, "Q4_1": 1, "Q6_K": 2, "Q4_K": 4}


def panel_available() -> bool:
    """Whether the dequantizing kernel builds and runs here (compiling it on first call)."""
    isa = cpu_isa()
    return isa is not None and _lib(isa) is not None


def amx_granted() -> bool:
    """Whether the CPU has AMX tiles and this process may use them (torch asks Linux for the
    tile permission; False where torch has no such call). oneDNN's bf16 GEMM uses them."""
    init = getattr(torch._C._cpu, "_init_amx", None)
    return bool(init()) if callable(init) else False


def panel_error() -> str | None:
    """Why :func:`panel_available` is False, or None."""
    isa = cpu_isa()
    if isa is None:
        return "the CPU lacks AVX2 (or the int8 kernel is off)"
    return None if _lib(isa) is not None else build_error(_SOURCE, _build(isa))


def dequantize_x16(w: PackedWeight, dtype: torch.dtype = torch.float32,
                   rows: slice | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """The dense ``[n, k]`` rows ``rows`` (default: all ``w.n``; step 1) of ``w``, contiguous, in
    ``dtype``: fp32 equals ``quant.dequantize`` of the :class:`QuantWeight` ``w`` was packed
    from, bit for bit; bf16 is that value rounded to nearest even (``.bfloat16()``). ``out``: a
    contiguous ``[n, k]`` tensor of ``dtype`` to write into (returned) in place of a new one."""
    start, stop, step = (rows or slice(None)).indices(w.n)
    if step != 1:
        raise ValueError(f"rows must be a contiguous slice, got step {step}")
    if out is None:
        out = torch.empty(max(stop - start, 0), w.k, dtype=dtype)
    elif out.dtype != dtype:
        raise ValueError(f"out must be {dtype}, got {out.dtype}")
    if stop > start:
        _dequant_into(w, start, stop, out)
    return out


def panel_matmul(x: torch.Tensor, parts: tuple[PackedWeight, ...],
                 dtype: torch.dtype = torch.bfloat16, panel_rows: int = PANEL_ROWS) -> torch.Tensor:
    """``x [M, K] @ W.T`` (fp32 in, fp32 ``[M, sum(n)]`` out) where ``W``'s rows are ``parts`` in
    order (row segments of any kinds, as ``quant_q8.quant_matmul_q8_rows``). Each segment is
    dequantized ``panel_rows`` rows at a time into one reused ``[panel_rows, K]`` buffer of
    ``dtype`` and multiplied by ``F.linear`` in ``dtype``; ``x`` is converted to ``dtype`` once.
    Transient memory: the panel (``panel_rows * K`` elements), ``x`` in ``dtype`` and one
    ``[M, panel_rows]`` product."""
    k = check_segments(x, parts)
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be bfloat16 or float32, got {dtype}")
    if panel_rows < 1:
        raise ValueError(f"panel_rows must be positive, got {panel_rows}")
    xd = x.to(dtype).contiguous()
    y = torch.empty(x.shape[0], sum(w.n for w in parts), dtype=torch.float32)
    panel = torch.empty(min(panel_rows, max(w.n for w in parts)), k, dtype=dtype)
    col = 0
    for w in parts:
        for r0 in range(0, w.n, panel_rows):
            r1 = min(r0 + panel_rows, w.n)
            buf = panel[:r1 - r0]
            _dequant_into(w, r0, r1, buf)
            y[:, col + r0:col + r1] = F.linear(xd, buf)
        col += w.n
    return y


def measure_panel_gops(k: int, n: int, m: int, dtype: torch.dtype = torch.bfloat16,
                       kind: str = "Q4_1", repeat: int = 3) -> float:
    """Useful GOP/s (``2 * m * n * k`` per product) of :func:`panel_matmul` on a random ``kind``
    weight ``[n, k]`` and ``m`` random rows: the median of ``repeat`` timed calls after one
    warm-up (for choosing the row count above which prefill takes this path)."""
    w = pack_x16(random_quant_weight(kind, n, k))
    x = torch.randn(m, k)
    panel_matmul(x, (w,), dtype)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        panel_matmul(x, (w,), dtype)
        times.append(time.perf_counter() - t)
    return 2.0 * m * n * k / statistics.median(times) / 1e9


def random_quant_weight(kind: str, n: int, k: int, seed: int = 0) -> QuantWeight:
    """A random ``[n, k]`` :class:`QuantWeight` of ``kind`` (integers over their whole range,
    scales of a trained model's order), for rate probes and benchmarks."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind.endswith("_K") and k % 256:
        raise ValueError(f"{kind} needs K a multiple of 256, got {k}")
    g = torch.Generator().manual_seed(seed)
    if kind == "Q4_1":
        qs = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
        d = torch.rand(n, k // 32, generator=g) * 0.004 + 0.001
        return QuantWeight(kind, qs, d, -8 * d)
    if kind == "Q4_K":
        qs = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
        heads = (torch.rand(n, k // 128, generator=g) * 2e-4 + 5e-5).half().float()
        sm = torch.randint(0, 64, (n, k // 16), dtype=torch.uint8, generator=g)
        return QuantWeight(kind, qs, heads, sm)
    if kind == "Q6_K":
        qs = torch.randint(0, 64, (n, k), dtype=torch.uint8, generator=g)
        d = (torch.rand(n, k // 256, generator=g) * 2e-5 + 5e-6).half().float()
        return QuantWeight(kind, qs, d, torch.randint(-128, 128, (n, k // 16), dtype=torch.int8,
                                                      generator=g))
    qs = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    return QuantWeight(kind, qs, torch.rand(n, k // 32, generator=g) * 2e-4 + 1e-4,
                       torch.empty(0))


def _dequant_into(w: PackedWeight, r0: int, r1: int, out: torch.Tensor) -> None:
    """Rows ``r0 .. r1`` of ``w`` into the contiguous ``out [r1 - r0, k]`` (fp32 or bf16)."""
    lib = _lib(w.isa)
    if lib is None:
        raise RuntimeError(f"the panel kernel is unavailable: {panel_error()}")
    if w.kind not in PANEL_KINDS:
        raise ValueError(f"the panel kernel has no {w.kind} path (it reads "
                         f"{', '.join(PANEL_KINDS)})")
    if out.dtype not in _DTYPES or not out.is_contiguous() or out.shape != (r1 - r0, w.k):
        raise ValueError(f"out must be contiguous bf16/fp32 [{r1 - r0}, {w.k}], got "
                         f"{out.dtype} {tuple(out.shape)}")
    if not 0 <= r0 <= r1 <= w.n or w.qs.shape[0] * TILE < w.n:
        raise ValueError(f"rows {r0}..{r1} outside the weight's {w.n}")
    m_ptr = w.m.data_ptr() if w.kind in ("Q4_1", "Q4_K", "Q6_K") else None
    lib.gs_x16_dequant(PANEL_KINDS[w.kind], w.qs.data_ptr(), w.d.data_ptr(), m_ptr, w.k, r0, r1,
                       out.data_ptr(), w.k, int(out.dtype == torch.bfloat16),
                       torch.get_num_threads())


def _build(isa: str) -> str:
    """The build of this source for a weight packed for ``isa`` (``quant_q8.ISAS``)."""
    return "avx2" if isa == "avx2" else "avx512"


def _lib(isa: str) -> ctypes.CDLL | None:
    build = _build(isa)
    return open_cached(_SOURCE, _COMMON + _ISA_FLAGS[build], build, declare=_declare)


def _declare(lib: ctypes.CDLL) -> None:
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.gs_x16_dequant.argtypes = [i32, ptr, ptr, ptr, i64, i64, i64, ptr, i64, i32, i32]
    lib.gs_x16_dequant.restype = None
