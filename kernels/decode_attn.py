"""Fused CPU decode attention over a shared prefix and each row's own keys
(``decode_attn_cpu.cpp``), and its torch reference.

The same computation as the batched-matmul cascade in ``grammarserve/attention/cascade.py``,
without the score tensors: on a 2-core CPU those matmuls and the softmax passes between them cost
most of a decode step. Built once per instruction set (AVX2 or AVX-512, chosen like the int8
matmul kernel: :func:`grammarserve_kernels.quant_q8.cpu_isa`).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from grammarserve_kernels.cpu_build import build_error, open_cached
from grammarserve_kernels.quant_q8 import _COMMON as _Q8_COMMON
from grammarserve_kernels.quant_q8 import _ISA_FLAGS as _Q8_ISA_FLAGS
from grammarserve_kernels.quant_q8 import cpu_isa

_SOURCE = Path(__file__).with_name("decode_attn_cpu.cpp")
_COMMON = _Q8_COMMON  # the same compiler flags and instruction-set builds as the matmuls
_FLAGS = {isa: _COMMON + _Q8_ISA_FLAGS[isa] for isa in ("avx2", "avx512")}
HEAD_DIMS = (64, 128)
KEY_TILE = 16  # keys per tile of the mirror's K layout (decode_attn_cpu.cpp)


def attention_isa() -> str | None:
    """The build this CPU runs (``avx2`` or ``avx512``), or None where none can."""
    isa = cpu_isa()
    if isa is None:
        return None
    return "avx512" if isa.startswith("avx512") and _open("avx512") is not None else (
        "avx2" if _open("avx2") is not None else None)


def decode_attention(q: torch.Tensor, kt: torch.Tensor, vs: torch.Tensor, kmt: torch.Tensor,
                     vm: torch.Tensor, qb: torch.Tensor, qlen: torch.Tensor,
                     isa: str | None = None) -> torch.Tensor:
    """Attention of the real queries ``q [N, H, D]`` (scaled by ``1/sqrt(D)`` already) over the
    shared prefix (``kt [KVH, D, P]`` transposed keys, ``vs [KVH, P, D]``; ``P`` may be 0) and
    their own rows' first ``qlen[n]`` keys (row ``qb[n]``) of the mirror: ``kmt
    [B, KVH, S/16, D, 16]`` keys in tiles of :data:`KEY_TILE` (transposed within a tile; see
    :func:`tile_keys`), ``vm [B, KVH, S, D]``. All fp32 and contiguous on CPU; returns
    ``[N, H, D]``."""
    isa = isa or attention_isa()
    lib = _open(isa) if isa else None
    if lib is None:
        raise RuntimeError("the decode attention kernel is unavailable: "
                           f"{build_error(_SOURCE, isa or 'avx2')}")
    n, h, d = q.shape
    kvh, s = vm.shape[1], vm.shape[2]
    p = kt.shape[2] if kt.numel() else 0
    for name, t in (("q", q), ("kt", kt), ("vs", vs), ("kmt", kmt), ("vm", vm)):
        if t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu":
            raise ValueError(f"{name} must be contiguous fp32 on CPU")
    if d not in HEAD_DIMS or h % kvh:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS} and heads a multiple of kv heads")
    tiled = (vm.shape[0], kvh, s // KEY_TILE, d, KEY_TILE)
    if s % KEY_TILE or kmt.shape != tiled:
        raise ValueError(f"kmt must be [B, KVH, S/16, D, 16] = {tiled} with S a multiple of "
                         f"{KEY_TILE}, got {tuple(kmt.shape)}")
    qb, qlen = qb.to(torch.int64).contiguous(), qlen.to(torch.int64).contiguous()
    out = torch.empty_like(q)
    lib.gs_decode_attention(q.data_ptr(), kt.data_ptr(), vs.data_ptr(), p, kmt.data_ptr(),
                            vm.data_ptr(), s, qb.data_ptr(), qlen.data_ptr(), n, h, kvh, d,
                            out.data_ptr(), torch.get_num_threads())
    return out


def tile_keys(k: torch.Tensor) -> torch.Tensor:
    """``k [B, KVH, S, D]`` (S a multiple of :data:`KEY_TILE`) -> ``[B, KVH, S/16, D, 16]``."""
    b, h, s, d = k.shape
    return k.view(b, h, s // KEY_TILE, KEY_TILE, d).transpose(3, 4).contiguous()


def untile_keys(kmt: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`tile_keys`."""
    b, h, tiles, d, t = kmt.shape
    return kmt.transpose(3, 4).reshape(b, h, tiles * t, d)


def attention_address(isa: str) -> int:
    """Address of the ``isa`` build's ``gs_decode_attention`` (for ``decode_stack_cpu.cpp``)."""
    lib = _open(isa)
    if lib is None:
        raise RuntimeError("the decode attention kernel is unavailable: "
                           f"{build_error(_SOURCE, isa)}")
    return ctypes.cast(lib.gs_decode_attention, ctypes.c_void_p).value or 0


def decode_attention_ref(q: torch.Tensor, kt: torch.Tensor, vs: torch.Tensor, kmt: torch.Tensor,
                         vm: torch.Tensor, qb: torch.Tensor, qlen: torch.Tensor) -> torch.Tensor:
    """Reference for :func:`decode_attention`: per query, softmax over [shared keys, own keys]."""
    n, h, d = q.shape
    kvh = vm.shape[1]
    group = h // kvh
    out = torch.empty_like(q)
    for i in range(n):
        b, length = int(qb[i]), int(qlen[i])
        for head in range(h):
            kv = head // group
            own = untile_keys(kmt)[b, kv, :length]
            keys = torch.cat([kt[kv].t(), own]) if kt.numel() else own
            vals = torch.cat([vs[kv], vm[b, kv, :length]]) if kt.numel() else vm[b, kv, :length]
            out[i, head] = torch.softmax(keys @ q[i, head], 0) @ vals
    return out


def _open(isa: str) -> ctypes.CDLL | None:
    return open_cached(_SOURCE, _FLAGS[isa], isa, declare=_declare)


def _declare(lib: ctypes.CDLL) -> None:
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.gs_decode_attention.argtypes = [ptr, ptr, ptr, i64, ptr, ptr, i64, ptr, ptr, i64, i64,
                                        i64, i64, ptr, i32]
    lib.gs_decode_attention.restype = ctypes.c_int
