"""Quantized matmuls with int8 activations (``quant_q8_cpu.cpp``), dispatched per instruction set,
and their torch reference.

Each row's activations are quantized per block of 32 (scale ``amax / 127``, values
``round(x * 127 / amax)``), as llama.cpp does for its Q8 blocks; the product of a block is then an
integer dot product with the weight's GGUF integers. :func:`quant_matmul_q8_ref` computes the
same quantized product in float64, so the kernel matches it to summation order.

The source is built once per instruction set (see the table in ``quant_q8_cpu.cpp``) and the
build is chosen at run time: :func:`cpu_isa` asks the CPU (cpuid) and the OS (XGETBV) through the
AVX2 build, never ``-march=native``. ``GRAMMARSERVE_CPU_ISA`` (``avx2`` | ``avx512`` |
``avx512vnni``) caps the choice, for tests and comparisons.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch
from grammarserve_kernels.cpu_build import build_error, open_cached
from grammarserve_kernels.quant import QuantWeight, dequantize

ISAS = ("avx2", "avx512", "avx512vnni")  # in order: each needs the one before
_SOURCE = Path(__file__).with_name("quant_q8_cpu.cpp")
_COMMON = ["-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-mavx2", "-mfma",
           "-ffp-contract=off"]  # the residual x - d * q rounds as the torch reference does
_ISA_FLAGS = {
    "avx2": [],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"],
    "avx512vnni": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni"],
}
TILE = 16  # weight rows per tile of the x16 layout
#: The kinds :func:`quant_matmul_q8` multiplies, in the order of :func:`gemm_addresses` (each
#: kind's index there is its code in ``decode_stack_cpu.cpp``).
KINDS = ("Q8_0", "Q4_1", "Q6_K", "Q5_1", "Q4_K")
_WITH_MIN = ("Q4_1", "Q5_1")  # the kinds with an fp32 offset m per block
_FLAGS = {isa: _COMMON + flags for isa, flags in _ISA_FLAGS.items()}


@dataclass(frozen=True)
class PackedWeight:
    """A :class:`QuantWeight` in the x16 layout of ``quant_q8_cpu.cpp``: ``qs`` uint8
    ``[tiles, blocks, groups, 64]`` (groups: 4 for Q4_1 and Q4_K, 5 for Q5_1: the 5 groups of 4
    bytes of its row layout, 6 for Q6_K: see :func:`_q6_groups`, 8 for Q8_0), ``d`` and ``m``
    fp32 ``[tiles, blocks, 16]`` (``m`` empty for Q8_0). Q4_K: ``d`` fp32 ``[tiles, K/256, 2,
    16]`` (each super-block's ``d`` then ``dmin``), ``m`` uint8 ``[tiles, blocks, 2, 16]`` (each
    block's 6-bit scale then min). Q6_K: ``d`` fp32 ``[tiles, K/256, 16]``, ``m`` int8
    ``[tiles, blocks, 2, 16]`` (the scales of elements 0-15 and 16-31). Rows past ``n`` are zero
    padding."""

    kind: str
    n: int
    k: int
    qs: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor
    isa: str  # the build that multiplies it (see :func:`cpu_isa`)
    levels: int = 2  # activation levels (see :func:`quant_matmul_q8`)

    @property
    def shape(self) -> tuple[int, int]:
        """``(N, K)`` of the dense weight."""
        return self.n, self.k


_GROUPS = {"Q4_1": 4, "Q4_K": 4, "Q5_1": 5, "Q6_K": 6, "Q8_0": 8}  # of 4 bytes a row and block


def _q6_groups(q: torch.Tensor) -> torch.Tensor:
    """Q6_K's 6-bit values ``[n, nb, 32]`` (uint8) -> ``[n, nb, 6, 4]``: with ``e[j][t]`` the
    value of element 4j + t, byte t of group g < 4 is ``e[g][t] & 15 | (e[4+g][t] & 15) << 4``
    (Q4_1's nibble order) and byte t of group 4 + p holds ``e[4p+j][t] >> 4`` in bits 2j, 2j+1."""
    e = q.view(q.shape[0], q.shape[1], 8, 4)
    low = (e[:, :, :4] & 15) | ((e[:, :, 4:] & 15) << 4)
    top = (e >> 4).view(q.shape[0], q.shape[1], 2, 4, 4)                 # [n, nb, p, j, t]
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(4, 1)
    plane = (top << shifts).sum(3, dtype=torch.uint8)                   # disjoint bits
    return torch.cat([low, plane], 2)


def _q6_values(g: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`_q6_groups`: ``[n, nb, 6, 4]`` -> ``[n, nb, 32]``."""
    low = torch.cat([g[:, :, :4] & 15, g[:, :, :4] >> 4], 2)             # [n, nb, 8, 4]
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(4, 1)
    top = (g[:, :, 4:, None] >> shifts) & 3                              # [n, nb, p, j, t]
    return (low | (top.reshape(low.shape) << 4)).reshape(g.shape[0], g.shape[1], 32)


def pack_x16(w: QuantWeight, isa: str | None = None, levels: int = 2) -> PackedWeight:
    """Interleave ``w``'s rows by tiles of 16 for :func:`quant_matmul_q8` on ``isa`` (default:
    :func:`cpu_isa`; the kernel must be available) with ``levels`` activation levels."""
    if w.kind not in KINDS:
        raise ValueError(f"the int8 kernel has no {w.kind} path (it multiplies {', '.join(KINDS)})")
    isa = isa or cpu_isa()
    if isa is None:
        raise RuntimeError(f"the int8 CPU kernel is unavailable: {kernel_error()}")
    n, k = w.shape
    nb, tiles = k // 32, -(-n // TILE)
    pad = tiles * TILE - n

    def tiled(t: torch.Tensor) -> torch.Tensor:  # [n, ...] -> [tiles, 16, ...] zero-padded
        t = torch.cat([t, t.new_zeros(pad, *t.shape[1:])]) if pad else t
        return t.view(tiles, TILE, *t.shape[1:])

    def pairs(t: torch.Tensor) -> torch.Tensor:  # [n, c * 2] -> [T, c, 2, 16]
        return tiled(t).view(tiles, TILE, -1, 2).permute(0, 2, 3, 1).contiguous()

    groups = _GROUPS[w.kind]
    raw = w.qs.view(torch.uint8)
    raw = _q6_groups(raw.view(n, nb, 32)) if w.kind == "Q6_K" else raw
    qs = tiled(raw.reshape(n, nb, groups, 4))  # [T, 16, nb, G, 4]
    qs = qs.permute(0, 2, 3, 1, 4).reshape(tiles, nb, groups, TILE * 4).contiguous()
    d = pairs(w.d) if w.kind == "Q4_K" else tiled(w.d).permute(0, 2, 1).contiguous()
    if w.kind in ("Q4_K", "Q6_K"):
        m = pairs(w.m)
    else:
        m = tiled(w.m).permute(0, 2, 1).contiguous() if w.kind in _WITH_MIN else w.m
    return PackedWeight(w.kind, n, k, qs, d, m, isa, levels)


def unpack_x16(p: PackedWeight) -> QuantWeight:
    """The :class:`QuantWeight` ``p`` was packed from (the exact inverse of :func:`pack_x16`):
    where a model keeps only the x16 layout, the row layout is rebuilt on demand."""
    n, k = p.shape
    tiles, nb = p.qs.shape[0], k // 32
    groups = p.qs.shape[2]

    def rows(t: torch.Tensor) -> torch.Tensor:  # [tiles, 16, ...] -> [n, ...]
        return t.reshape(tiles * TILE, *t.shape[2:])[:n]

    qs = rows(p.qs.view(tiles, nb, groups, TILE, 4).permute(0, 3, 1, 2, 4))  # [n, nb, G, 4]
    qs = _q6_values(qs) if p.kind == "Q6_K" else qs
    qs = qs.reshape(n, -1)
    if p.kind == "Q8_0":
        qs = qs.view(torch.int8)
    if p.kind == "Q4_K":
        d = rows(p.d.permute(0, 3, 1, 2)).reshape(n, -1)
    else:
        d = rows(p.d.permute(0, 2, 1)).reshape(n, -1)
    if p.kind in ("Q4_K", "Q6_K"):
        m = rows(p.m.permute(0, 3, 1, 2)).reshape(n, 2 * nb)
    else:
        m = rows(p.m.permute(0, 2, 1)).reshape(n, nb) if p.kind in _WITH_MIN else p.m
    return QuantWeight(p.kind, qs.contiguous(), d.contiguous(), m.contiguous())


@functools.cache
def _cpu_level() -> int:
    """``gs_cpu_level`` once per process (the avx2 build must be open): CPUID traps to the
    hypervisor on a VM (~15 us a call)."""
    lib = _open("avx2")
    assert lib is not None
    return int(lib.gs_cpu_level())


def cpu_isa() -> str | None:
    """The widest instruction set of :data:`ISAS` this CPU and OS run (capped by
    ``GRAMMARSERVE_CPU_ISA``), or None where not even AVX2 can run or the kernel cannot be built."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    if _open("avx2") is None:
        return None
    level = _cpu_level()
    if level < 1:
        return None
    best = ISAS[level - 1]
    cap = os.environ.get("GRAMMARSERVE_CPU_ISA")
    if cap:
        if cap not in ISAS:
            raise ValueError(f"GRAMMARSERVE_CPU_ISA must be one of {', '.join(ISAS)}, got {cap!r}")
        best = ISAS[min(ISAS.index(cap), ISAS.index(best))]
    return best if _open(best) is not None else "avx2"


def supported_isas() -> list[str]:
    """Every instruction set of :data:`ISAS` this machine runs (for tests and benchmarks)."""
    best = cpu_isa()
    return [] if best is None else list(ISAS[:ISAS.index(best) + 1])


def kernel_error(isa: str = "avx2") -> str | None:
    """Why the ``isa`` build is unavailable, or None."""
    _open(isa)
    return build_error(_SOURCE, isa)


def quant_matmul_q8(x: torch.Tensor, w: PackedWeight, isa: str | None = None,
                    levels: int | None = None) -> torch.Tensor:
    """``x [R, K] @ w.T`` with int8 activations, on the ``isa`` build (default: ``w.isa``), with
    ``levels`` (default: ``w.levels``):

    ``levels=1``: one int8 level (llama.cpp's Q8 activations, ~0.5% relative error per product);
    ``levels=2``: the int8 value plus its int8 residual (~0.002%), about 1.5x the work."""
    return quant_matmul_q8_rows(x, (w,), isa, levels)


def check_segments(x: torch.Tensor, parts: tuple[PackedWeight, ...]) -> int:
    """The K that ``parts`` (row segments of one weight) share; raises ValueError unless there
    is at least one, they share K and ``x`` is fp32 ``[rows, K]`` on CPU."""
    if not parts:
        raise ValueError("a weight needs at least one row segment")
    k = parts[0].k
    if any(w.k != k for w in parts):
        raise ValueError(f"row segments must share K, got {[w.k for w in parts]}")
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != k or x.device.type != "cpu":
        raise ValueError(f"x must be fp32 [R, {k}] on CPU, got {x.dtype} {tuple(x.shape)}")
    return k


def quant_matmul_q8_rows(x: torch.Tensor, parts: tuple[PackedWeight, ...], isa: str | None = None,
                         levels: int | None = None) -> torch.Tensor:
    """``x [R, K] @ W.T`` where ``W``'s output rows are ``parts`` in order (row segments, each of
    its own kind, e.g. a fused qkv of Q4_1 q/k and Q6_K v): each segment's GEMM writes its columns
    of the one ``[R, sum(n)]`` output in place (no concatenation). ``isa`` and ``levels`` as in
    :func:`quant_matmul_q8` (defaults: each segment's own). A segment's columns equal
    :func:`quant_matmul_q8` of it alone, bit for bit."""
    k = check_segments(x, parts)
    for w in parts:
        if (levels or w.levels) not in (1, 2):
            raise ValueError(f"levels must be 1 or 2, got {levels or w.levels}")
    x = x.contiguous()
    n_total = sum(w.n for w in parts)
    y = torch.empty(x.shape[0], n_total, dtype=torch.float32)
    col = 0
    for w in parts:
        _gemm_into(x, w, y, col, isa or w.isa, levels or w.levels)
        col += w.n
    return y


def _gemm_into(x: torch.Tensor, w: PackedWeight, y: torch.Tensor, col: int, isa: str,
               levels: int) -> None:
    """``x @ w.T`` into columns ``col .. col + w.n`` of the contiguous ``y [R, N]``."""
    lib = _open(isa) if isa else None
    if lib is None:
        raise RuntimeError("the int8 CPU kernel is unavailable: "
                           f"{build_error(_SOURCE, isa or 'avx2')}")
    r, k, n, ldy = x.shape[0], w.k, w.n, y.shape[1]
    out = y.data_ptr() + 4 * col  # fp32
    threads = torch.get_num_threads()
    if w.kind in (*_WITH_MIN, "Q4_K"):
        gemm = {"Q4_1": lib.gs_q4_1_gemm_q8, "Q5_1": lib.gs_q5_1_gemm_q8,
                "Q4_K": lib.gs_q4_k_gemm_q8}[w.kind]
        gemm(x.data_ptr(), r, k, w.qs.data_ptr(), w.d.data_ptr(), w.m.data_ptr(), n, out, ldy,
             threads, levels)
    elif w.kind == "Q6_K":
        lib.gs_q6_k_gemm_q8(x.data_ptr(), r, k, w.qs.data_ptr(), w.d.data_ptr(), w.m.data_ptr(),
                            n, out, ldy, threads, levels)
    else:
        lib.gs_q8_0_gemm_q8(x.data_ptr(), r, k, w.qs.data_ptr(), w.d.data_ptr(), n, out, ldy,
                            threads, levels)


def gemm_addresses(isa: str) -> tuple[int, ...]:
    """Addresses of the ``isa`` build's GEMM entry points, one per kind of :data:`KINDS` (for
    kernels that call them from C++, e.g. ``decode_stack_cpu.cpp``)."""
    lib = _open(isa)
    if lib is None:
        raise RuntimeError(f"the int8 CPU kernel is unavailable: {build_error(_SOURCE, isa)}")
    return tuple(ctypes.cast(getattr(lib, f"gs_{kind.lower()}_gemm_q8"), ctypes.c_void_p).value
                 or 0 for kind in KINDS)


def quantize_activations_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [R, K]`` -> (int8 values ``[R, K]``, scales ``[R, K/32]``), as the kernel quantizes."""
    r, k = x.shape
    blocks = x.float().view(r, k // 32, 32)
    amax = blocks.abs().amax(-1)
    inv = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros(()))
    q = torch.round(blocks * inv[..., None]).to(torch.int8)
    return q.view(r, k), amax / 127.0


def quantize_residual_ref(x: torch.Tensor, q: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    """The second activation level: ``x - dx * q`` on the fixed grid ``dx / 256`` (int8 values,
    clamped to +-127), as the kernel quantizes it; its scale is ``dx / 256``."""
    r, k = x.shape
    blocks = x.float().view(r, k // 32, 32)
    rest = blocks - q.float().view(r, k // 32, 32) * dx[..., None]
    amax = blocks.abs().amax(-1)
    inv = torch.where(amax > 0, torch.tensor(256.0 * 127.0) / amax, torch.zeros(()))
    return torch.round(rest * inv[..., None]).clamp(-127, 127).to(torch.int8).view(r, k)


def quant_matmul_q8_ref(x: torch.Tensor, w: QuantWeight, levels: int = 2) -> torch.Tensor:
    """Reference for :func:`quant_matmul_q8`: the same quantized product, in float64."""
    n, k = w.shape
    r = x.shape[0]
    q, dx = quantize_activations_ref(x)
    parts = [(q, dx)]
    if levels == 2:
        parts.append((quantize_residual_ref(x, q, dx), dx / 256.0))
    out = torch.zeros(r, n, dtype=torch.float64)
    for q, dx in parts:
        qx = q.double().view(r, k // 32, 32)
        if w.kind != "Q8_0":
            dense = dequantize(w).double()  # d * q + m, d * (q - 32): exact, as the GGUF has it
            out += (qx * dx.double()[..., None]).view(r, k) @ dense.t()
        else:
            dots = torch.einsum("rbj,nbj->rnb", qx, w.qs.double().view(n, k // 32, 32))
            out += (dots * dx.double()[:, None, :] * w.d.double()[None]).sum(-1)
    return out.float()


def quant_matmul_q8_rows_ref(x: torch.Tensor, parts: tuple[QuantWeight, ...],
                             levels: int = 2) -> torch.Tensor:
    """Reference for :func:`quant_matmul_q8_rows`: the segments' references side by side."""
    return torch.cat([quant_matmul_q8_ref(x, w, levels) for w in parts], 1)


def _open(isa: str) -> ctypes.CDLL | None:
    return open_cached(_SOURCE, _FLAGS[isa], isa, declare=_declare, refuse=_disabled)


def _disabled() -> str | None:
    if os.environ.get("GRAMMARSERVE_QUANT_KERNEL", "1") == "0":
        return "disabled by GRAMMARSERVE_QUANT_KERNEL=0"
    return None


def _declare(lib: ctypes.CDLL) -> None:
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.gs_q4_1_gemm_q8.argtypes = [ptr, i64, i64, ptr, ptr, ptr, i64, ptr, i64, i32, i32]
    lib.gs_q4_1_gemm_q8.restype = None
    lib.gs_q5_1_gemm_q8.argtypes = [ptr, i64, i64, ptr, ptr, ptr, i64, ptr, i64, i32, i32]
    lib.gs_q5_1_gemm_q8.restype = None
    lib.gs_q4_k_gemm_q8.argtypes = [ptr, i64, i64, ptr, ptr, ptr, i64, ptr, i64, i32, i32]
    lib.gs_q4_k_gemm_q8.restype = None
    lib.gs_q8_0_gemm_q8.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, i64, i32, i32]
    lib.gs_q8_0_gemm_q8.restype = None
    lib.gs_q6_k_gemm_q8.argtypes = [ptr, i64, i64, ptr, ptr, ptr, i64, ptr, i64, i32, i32]
    lib.gs_q6_k_gemm_q8.restype = None
    lib.gs_cpu_level.restype = ctypes.c_int
