"""Skinny matmuls over GGUF Q4_1 / Q8_0 weight blocks (and Q4_0, Q4_K, Q5_0 repacked into them)
on AVX2 CPUs, and their torch reference; the GGUF block repacking every quantized kernel starts
from (Q5_1 / Q5_K and Q6_K too, which only the int8-activation kernel of ``quant_q8.py``
multiplies).

The C++ kernel (``quant_cpu.cpp``) is compiled with the system C++ compiler on first use into a
per-source-hash cache folder and loaded through ctypes; where that is impossible (no compiler, no
AVX2, not x86) :func:`quant_kernel_available` is False and callers keep their fp32 path. Weights
are repacked once from the GGUF block bytes by :func:`pack_gguf_blocks`; :func:`dequantize` is
the reference (the same values ``gguf.quants.dequantize`` gives) and :func:`quant_matmul_ref` the
reference product.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from grammarserve_kernels.cpu_build import build_error, open_cached

_SOURCE = Path(__file__).with_name("quant_cpu.cpp")
_FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
# GGUF type -> (bytes per block of 32, header bytes before the quants)
_BLOCK = {"Q4_1": (20, 4), "Q8_0": (34, 2)}


@dataclass(frozen=True)
class QuantWeight:
    """One ``[N, K]`` weight in kernel layout (see ``quant_cpu.cpp``).

    ``qs`` is uint8 ``[N, K/2]`` (Q4_1), int8 ``[N, K]`` (Q8_0), uint8 ``[N, K]`` (Q6_K: the
    6-bit values 0..63, natural order) or uint8 ``[N, K/32 * 20]`` (Q5_1: per block of 32, 5
    groups of 4 bytes in the order the x16 kernel widens them: with ``e[j][t]`` the 5-bit value
    of element 4j + t, byte t of group g < 4 is ``e[g][t] | (e[4+g][t] & 7) << 5`` and byte t of
    group 4 holds ``e[4+g][t] >> 3`` in bits 2g, 2g+1); ``d`` and ``m`` are
    fp32 ``[N, K/32]`` (``m`` is empty for Q8_0). A value stands for ``d * q + m`` (Q4_1, Q5_1)
    or ``d * q`` (Q8_0). Q6_K (GGUF's own super-blocks): ``d`` fp32 ``[N, K/256]`` (each
    super-block's ``d``, exact from fp16), ``m`` int8 ``[N, K/16]`` (the scale ``sc`` of each 16
    values), and a value stands for ``(d * sc) * (q - 32)`` (the product exact in fp32). Q4_K (GGUF's own super-blocks, 4.75 bits a
    weight): ``qs`` as Q4_1, ``d`` fp32 ``[N, K/128]``: per 256 values the super-block's ``d``
    and ``dmin`` (exact from fp16), ``m`` uint8 ``[N, K/16]``: per 32 values the 6-bit scale
    ``sc`` and min ``mn``; a value of sub-block j stands for ``(d * sc) * q - dmin * mn`` (both
    products exact in fp32, as ``gguf.quants`` computes them).
    """

    kind: str
    qs: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        """``(N, K)`` of the dense weight."""
        per_d = {"Q6_K": 256, "Q4_K": 128}.get(self.kind, 32)
        return self.d.shape[0], self.d.shape[1] * per_d

    def nbytes(self) -> int:
        """Bytes the kernel streams per product."""
        return sum(t.numel() * t.element_size() for t in (self.qs, self.d, self.m))


#: GGUF types repacked losslessly into a kernel layout -> (bytes per 256 elements, layout).
_REPACKED = {"Q4_K": (144, "Q4_K"), "Q5_K": (176, "Q5_1")}
#: GGUF types of 32-value blocks repacked losslessly -> (bytes per block, layout).
_REPACKED_32 = {"Q4_0": (18, "Q4_1"), "Q5_0": (22, "Q8_0"), "Q5_1": (24, "Q5_1")}
_Q6_K_BYTES = 210  # per 256 values: ql[128], qh[64], int8 scales[16], fp16 d
#: Every GGUF type :func:`pack_gguf_blocks` takes.
PACKED_TYPES = (*_BLOCK, *_REPACKED, *_REPACKED_32, "Q6_K")
#: Bytes a weight of each type in :data:`PACKED_TYPES` takes once repacked (the kernel layouts:
#: Q4_1 4 bits + fp32 d and m per 32; Q4_K 4 bits + u8 scale and min per 32 + fp32 d and dmin
#: per 256; Q5_1 5 bits + fp32 d and m per 32; Q8_0 8 bits + fp32 d per 32; Q6_K 6 bits + fp32
#: d per 256 and int8 scale per 16, 6.625 bits in the x16 layout (the row layout keeps a byte a
#: value: 8.625)).
LAYOUT_BYTES_PER_WEIGHT = {"Q4_1": 0.75, "Q4_K": 0.59375, "Q4_0": 0.75, "Q5_1": 0.875,
                           "Q5_K": 0.875, "Q8_0": 1.125, "Q5_0": 1.125, "Q6_K": 0.828125}
#: The :class:`QuantWeight` kinds :func:`quant_matmul` (fp32 activations) multiplies; the others
#: (Q5_1, Q6_K) have only the int8-activation kernel.
FP32_KERNEL_KINDS = tuple(_BLOCK)


def pack_gguf_blocks(kind: str, raw: np.ndarray) -> QuantWeight:
    """Repack GGUF block bytes ``[N, K/32 * block_bytes]`` (uint8) of type ``kind``.

    Every repack is lossless: :func:`dequantize` gives ``gguf.quants.dequantize``'s values bit
    for bit (Q4_0's zeros up to their sign: see below).
    Q4_K keeps its kind (:class:`QuantWeight`: 4.75 bits a weight in place of 4.5). Q5_K
    (256-element super-blocks) becomes the Q5_1 layout: its 8 sub-blocks' 6-bit scale and min
    times the super-block's ``d`` / ``dmin`` are exact in fp32 (7 bits a weight in place of 5.5). Q4_0 (``d * (q - 8)``) becomes Q4_1 with
    ``m = -8 d`` (exact; 6 bits in place of 4.5; ``d * q + m`` is exact too, but a zero comes
    out +0.0 where gguf's ``d * 0`` with a negative ``d`` gives -0.0). Q5_0 (``d * (q - 16)``)
    becomes Q8_0 with the int8 ``q - 16`` (9 bits in place of 5.5); Q5_1 keeps its kind (7 bits
    in place of 6). Q6_K keeps its own kind: one byte per 6-bit value (in the row layout; the x16
    layout packs them back to 6 bits), its int8 scales and fp32 ``d`` (``d * scale`` is exact: an
    fp16 times an int8 has at most 18 significant bits; fp32 holds 24)."""
    if kind in _REPACKED:
        return _pack_k(kind, raw)
    if kind in _REPACKED_32:
        return _pack_32(kind, raw)
    if kind == "Q6_K":
        return _pack_q6_k(raw)
    if kind not in _BLOCK:
        raise ValueError(f"unsupported quant type {kind!r} (supported: {', '.join(PACKED_TYPES)})")
    size, head = _BLOCK[kind]
    blocks = _split(kind, raw, size)
    d = torch.from_numpy(_f16(blocks[..., 0:2])[..., 0])
    quants = blocks[..., head:].reshape(raw.shape[0], -1)
    if kind == "Q4_1":
        m = torch.from_numpy(_f16(blocks[..., 2:4])[..., 0])
        return QuantWeight(kind, torch.from_numpy(quants.copy()), d, m)
    return QuantWeight(kind, torch.from_numpy(quants.copy().view(np.int8)), d,
                       torch.empty(0, dtype=torch.float32))


def _split(kind: str, raw: np.ndarray, size: int) -> np.ndarray:
    """``raw [N, nb * size]`` as ``[N, nb, size]`` blocks (checked)."""
    if raw.dtype != np.uint8 or raw.ndim != 2 or raw.shape[1] % size:
        raise ValueError(f"{kind} blocks must be uint8 [N, nb*{size}], got {raw.dtype} {raw.shape}")
    return np.ascontiguousarray(raw).reshape(raw.shape[0], -1, size)


def _f16(b: np.ndarray) -> np.ndarray:
    """Bytes ``[..., 2]`` of little-endian fp16 as fp32 ``[..., 1]`` (exact)."""
    return b.copy().view(np.float16).astype(np.float32)


def _q5_layout(q: np.ndarray) -> np.ndarray:
    """5-bit values ``[N, nb, 32]`` (uint8) -> Q5_1 ``qs [N, nb * 20]`` (:class:`QuantWeight`)."""
    n = q.shape[0]
    e = q.reshape(n, -1, 8, 4)                                            # [N, nb, j, t]
    low = e[:, :, :4] | ((e[:, :, 4:] & 7) << 5)                          # groups 0-3
    top = np.bitwise_or.reduce((e[:, :, 4:] >> 3) << np.array([0, 2, 4, 6], np.uint8)[:, None],
                               axis=2)                                    # group 4: [N, nb, t]
    return np.concatenate([low, top[:, :, None]], 2).reshape(n, -1)


def _pack_32(kind: str, raw: np.ndarray) -> QuantWeight:
    size, _ = _REPACKED_32[kind]
    blocks = _split(kind, raw, size)
    n = raw.shape[0]
    d = _f16(blocks[..., 0:2])[..., 0]                                    # [N, nb]
    if kind == "Q4_0":  # d, qs[16] (Q4_1's nibble order)
        return QuantWeight("Q4_1", torch.from_numpy(blocks[..., 2:].reshape(n, -1).copy()),
                           torch.from_numpy(d), torch.from_numpy(-8.0 * d))
    head = 2 if kind == "Q5_0" else 4  # Q5_1: d, m; then qh (bit j: element j), qs[16]
    qh = blocks[..., head:head + 4].copy().view(np.uint32)                # [N, nb, 1]
    high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)  # [N, nb, 32]
    qs = blocks[..., head + 4:]
    q = np.concatenate([qs & 0x0F, qs >> 4], -1) | (high << 4)            # [N, nb, 32]: 0..31
    if kind == "Q5_0":
        return QuantWeight("Q8_0", torch.from_numpy((q.astype(np.int8) - 16).reshape(n, -1)),
                           torch.from_numpy(d), torch.empty(0, dtype=torch.float32))
    m = _f16(blocks[..., 2:4])[..., 0]
    return QuantWeight("Q5_1", torch.from_numpy(_q5_layout(q)), torch.from_numpy(d),
                       torch.from_numpy(m))


def _pack_k(kind: str, raw: np.ndarray) -> QuantWeight:
    """Q4_K super-blocks into the Q4_K layout, Q5_K into Q5_1."""
    size, layout = _REPACKED[kind]
    blocks = _split(kind, raw, size)
    n = raw.shape[0]
    d = _f16(blocks[..., 0:2])                                            # [N, nb, 1]
    dmin = _f16(blocks[..., 2:4])
    sc, mn = _q4_k_scales(blocks[..., 4:16])                              # [N, nb, 8] each
    qs = blocks[..., -128:].reshape(n, -1, 4, 32)                         # 2 sub-blocks a row
    q = np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(n, -1, 8, 32)      # [N, nb, 8, 32]
    if kind == "Q4_K":
        packed = (q[..., :16] | (q[..., 16:] << 4)).reshape(n, -1)        # Q4_1: j | (j+16) << 4
        heads = np.concatenate([d, dmin], -1).reshape(n, -1)              # [N, nb * 2]
        scales = np.stack([sc, mn], -1).astype(np.uint8).reshape(n, -1)   # [N, nb * 16]
        return QuantWeight(kind, torch.from_numpy(np.ascontiguousarray(packed)),
                           torch.from_numpy(heads), torch.from_numpy(scales))
    # Q5_K: the high bit of sub-block s's element i is bit s of qh[i]
    qh = blocks[..., 16:48].reshape(n, -1, 1, 32)
    q |= ((qh >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1) << 4
    packed = _q5_layout(q.reshape(n, -1, 32))
    return QuantWeight(layout, torch.from_numpy(np.ascontiguousarray(packed)),
                       torch.from_numpy((d * sc).reshape(n, -1)),
                       torch.from_numpy((-(dmin * mn)).reshape(n, -1)))


def _pack_q6_k(raw: np.ndarray) -> QuantWeight:
    blocks = _split("Q6_K", raw, _Q6_K_BYTES)
    n = raw.shape[0]
    # value 128h + 32j + l: low 4 bits from ql[64h + 32(j%2) + l] (high nibble for j >= 2),
    # high 2 bits from bits 2j..2j+1 of qh[32h + l] (gguf.quants.Q6_K)
    ql = blocks[..., :128].reshape(n, -1, 2, 1, 2, 32)                  # [N, nb, h, ., j%2, l]
    lo = np.concatenate([ql & 0x0F, ql >> 4], axis=3).reshape(n, -1, 2, 4, 32)
    qh = blocks[..., 128:192].reshape(n, -1, 2, 1, 32)
    hi = (qh >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)) & 0x03   # [N, nb, h, j, l]
    q = (lo | (hi << 4)).reshape(n, -1)
    scales = blocks[..., 192:208].copy().view(np.int8)                 # [N, nb, 16]
    d = _f16(blocks[..., 208:210])                                      # [N, nb, 1]
    return QuantWeight("Q6_K", torch.from_numpy(q.copy()), torch.from_numpy(d.reshape(n, -1)),
                       torch.from_numpy(scales.reshape(n, -1)))


def _q4_k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 sub-blocks' 6-bit scales and mins (fp32) from Q4_K's 12 packed bytes."""
    s = packed.astype(np.uint8)
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], -1)
    mn = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], -1)
    return sc.astype(np.float32), mn.astype(np.float32)


def dequantize(w: QuantWeight) -> torch.Tensor:
    """The dense fp32 ``[N, K]`` weight ``w`` stands for."""
    n, k = w.shape
    if w.kind == "Q4_1":
        q = w.qs.view(n, k // 32, 16)
        q = torch.cat([q & 0x0F, q >> 4], dim=2).float()  # byte j: element j (low), j+16 (high)
        return (w.d[..., None] * q + w.m[..., None]).reshape(n, k)
    if w.kind == "Q4_K":
        q = w.qs.view(n, k // 32, 16)
        q = torch.cat([q & 0x0F, q >> 4], dim=2).float()
        heads = w.d.view(n, k // 256, 1, 2)
        sm = w.m.view(n, k // 256, 8, 2).float()
        scale = (heads[..., 0] * sm[..., 0]).view(n, k // 32, 1)  # exact: fp16 x 6 bits
        low = (heads[..., 1] * sm[..., 1]).view(n, k // 32, 1)
        return (scale * q - low).reshape(n, k)
    if w.kind == "Q5_1":
        g = w.qs.view(n, k // 32, 5, 4).int()  # see QuantWeight: [N, nb, group, t]
        top = (g[:, :, 4:] >> torch.tensor([0, 2, 4, 6])[:, None]) & 3
        e = torch.cat([g[:, :, :4] & 31, (g[:, :, :4] >> 5) | (top << 3)], 2)  # [N, nb, j, t]
        q = e.view(n, k // 32, 32).float()  # element 4j + t
        return (w.d[..., None] * q + w.m[..., None]).reshape(n, k)
    if w.kind == "Q6_K":
        q = w.qs.view(n, k // 16, 16).float() - 32.0  # exact, as are the products
        scale = w.d.view(n, k // 256, 1) * w.m.view(n, k // 256, 16).float()
        return (scale.view(n, k // 16, 1) * q).reshape(n, k)
    return (w.d[..., None] * w.qs.view(n, k // 32, 32).float()).reshape(n, k)


def as_q4_1(w: QuantWeight) -> QuantWeight:
    """A Q4_K weight in the Q4_1 layout (the same nibbles, fp32 ``d * sc`` and
    ``-(dmin * mn)`` per 32: exact, 6 bits a weight), for the fp32-activation kernel, which has
    no Q4_K path; any other kind is returned as it is."""
    if w.kind != "Q4_K":
        return w
    n, k = w.shape
    heads = w.d.view(n, k // 256, 1, 2)
    sm = w.m.view(n, k // 256, 8, 2).float()
    return QuantWeight("Q4_1", w.qs, (heads[..., 0] * sm[..., 0]).reshape(n, -1),
                       (-(heads[..., 1] * sm[..., 1])).reshape(n, -1))


def quant_matmul_ref(x: torch.Tensor, w: QuantWeight) -> torch.Tensor:
    """Reference ``x @ dequantize(w).T``."""
    return x @ dequantize(w).t()


def quant_matmul(x: torch.Tensor, w: QuantWeight) -> torch.Tensor:
    """``x [R, K] @ w.T`` with the AVX2 kernel; ``x`` is fp32 on CPU. Needs the kernel, and ``w``
    of a kind it has (:data:`FP32_KERNEL_KINDS`) or Q4_K (converted by :func:`as_q4_1` each
    call: convert once where the weight is kept)."""
    w = as_q4_1(w)
    if w.kind not in FP32_KERNEL_KINDS:
        raise ValueError(f"the fp32-activation kernel has no {w.kind} path (it multiplies "
                         f"{', '.join(FP32_KERNEL_KINDS)}); use quant_q8.quant_matmul_q8")
    lib = _load()
    if lib is None:
        raise RuntimeError(f"the quantized CPU kernel is unavailable: {build_error(_SOURCE)}")
    n, k = w.shape
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != k or x.device.type != "cpu":
        raise ValueError(f"x must be fp32 [R, {k}] on CPU, got {x.dtype} {tuple(x.shape)}")
    x = x.contiguous()
    y = torch.empty(x.shape[0], n, dtype=torch.float32)
    if w.kind == "Q4_1":
        lib.gs_q4_1_gemm(x.data_ptr(), x.shape[0], k, w.qs.data_ptr(), w.d.data_ptr(),
                         w.m.data_ptr(), n, y.data_ptr(), torch.get_num_threads())
    else:
        lib.gs_q8_0_gemm(x.data_ptr(), x.shape[0], k, w.qs.data_ptr(), w.d.data_ptr(), n,
                         y.data_ptr(), torch.get_num_threads())
    return y


def quant_kernel_available() -> bool:
    """Whether :func:`quant_matmul` can run here (compiling the kernel on first call)."""
    return _load() is not None


def quant_kernel_error() -> str | None:
    """Why the kernel is unavailable, or None."""
    _load()
    return build_error(_SOURCE)


def _load() -> ctypes.CDLL | None:
    return open_cached(_SOURCE, _FLAGS, declare=_declare, refuse=_refused)


def _refused() -> str | None:
    if os.environ.get("GRAMMARSERVE_QUANT_KERNEL", "1") == "0":
        return "disabled by GRAMMARSERVE_QUANT_KERNEL=0"
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return f"the CPU lacks AVX2 (torch reports {torch.backends.cpu.get_cpu_capability()})"
    return None


def _declare(lib: ctypes.CDLL) -> None:
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.gs_q4_1_gemm.argtypes = [ptr, i64, i64, ptr, ptr, ptr, i64, ptr, i32]
    lib.gs_q4_1_gemm.restype = None
    lib.gs_q8_0_gemm.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, i32]
    lib.gs_q8_0_gemm.restype = None
