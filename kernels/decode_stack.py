"""The decoder stack of a Llama-family model for one decode step in one C++ call
(``decode_stack_cpu.cpp``), and its torch reference.

Per layer: RMSNorm, the fused QKV projection, rotary embedding, the new K/V written to the pool
and to the decode mirror, decode attention (shared prefix plus each row's own keys), the output
projection, RMSNorm, gate/up, SiLU-and-multiply, down, and both residual adds; then, with a
:class:`StackHead`, the final RMSNorm and the LM head of the logit rows. The matmuls are the
int8-activation kernels of :mod:`grammarserve_kernels.quant_q8` and the attention is
:mod:`grammarserve_kernels.decode_attn`, called from C++ through their addresses, so each keeps
its own per-instruction-set build; this glue is built once (AVX2).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from grammarserve_kernels.cpu_build import build_error, open_cached
from grammarserve_kernels.decode_attn import (
    HEAD_DIMS,
    KEY_TILE,
    attention_address,
    attention_isa,
    decode_attention_ref,
)
from grammarserve_kernels.quant_q8 import (
    _COMMON,
    KINDS,
    PackedWeight,
    gemm_addresses,
    quant_matmul_q8_rows_ref,
    unpack_x16,
)

_SOURCE = Path(__file__).with_name("decode_stack_cpu.cpp")
_i64, _ptr, _i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int32
_Table = ctypes.Array[ctypes.c_void_p]  # per-layer addresses


@dataclass(frozen=True)
class StackLinear:
    """One projection: its GGUF blocks as row segments in the kernel's x16 layout, in row order
    (``packed``; e.g. a fused qkv of Q4_1 q/k rows and Q6_K v rows), and an optional bias."""

    packed: tuple[PackedWeight, ...]
    bias: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if not self.packed:
            raise ValueError("a projection needs at least one packed segment")
        if len({p.k for p in self.packed}) != 1:
            raise ValueError("the segments must share K")
        if len({(p.isa, p.levels) for p in self.packed}) != 1:
            raise ValueError("a projection's segments must share their build and levels")

    @property
    def n(self) -> int:
        """Output rows (the segments' sum)."""
        return sum(p.n for p in self.packed)


@dataclass(frozen=True)
class StackLayer:
    """One decoder layer's weights (``qkv``: q, k, v rows stacked; ``gate_up``: gate then up)."""

    norm1: torch.Tensor
    norm2: torch.Tensor
    qkv: StackLinear
    o: StackLinear
    gate_up: StackLinear
    down: StackLinear


@dataclass(frozen=True)
class StackHead:
    """The final RMSNorm's weight and the LM head (no bias), applied to the logit rows in the
    same call as the layers."""

    norm: torch.Tensor
    lm_head: StackLinear


@dataclass(frozen=True)
class StackDims:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    eps: float


@dataclass
class StackKV:
    """Where one step's K/V live, per layer: the pool ``[slots, KVH, D]``, the decode mirror
    (K in tiles ``[B, KVH, S/16, D, 16]``, V ``[B, KVH, S, D]``) and the shared prefix (``kt [KVH, D, P]``, ``vs [KVH, P, D]``; empty lists:
    no shared prefix); and per new token its pool slot, mirror row and mirror position."""

    pool_k: list[torch.Tensor]
    pool_v: list[torch.Tensor]
    mirror_k: list[torch.Tensor]
    mirror_v: list[torch.Tensor]
    kt: list[torch.Tensor]
    vs: list[torch.Tensor]
    slots: torch.Tensor
    qb: torch.Tensor
    qpos: torch.Tensor
    # Equal keys (compared by identity, element by element) promise the same tensors in the
    # six lists, so their address tables are reused; None: rebuilt every call.
    key: tuple[object, ...] | None = None


class _Segment(ctypes.Structure):  # GsSegment of decode_stack_cpu.cpp
    _fields_ = [("qs", _ptr), ("d", _ptr), ("m", _ptr), ("n", _i64), ("kind", _i32),
                ("levels", _i32)]


class _Linear(ctypes.Structure):  # GsLinear
    _fields_ = [("segs", _ptr), ("n_segs", _i64), ("bias", _ptr), ("n", _i64), ("k", _i64)]


class _Head(ctypes.Structure):  # GsHead of decode_stack_cpu.cpp
    _fields_ = [("norm", _ptr), ("lin", _Linear), ("rows", _ptr), ("n_rows", _i64),
                ("logits", _ptr)]


class _Layer(ctypes.Structure):
    _fields_ = [("norm1", _ptr), ("norm2", _ptr), ("qkv", _Linear), ("o", _Linear),
                ("gate_up", _Linear), ("down", _Linear)]


_STEP_INTS = ("tokens", "hidden", "heads", "kv_heads", "head_dim", "inter", "layers", "S", "P")
_STEP_PTRS = ("cos", "sin", "slots", "qb", "qpos", "qlen", "pool_k", "pool_v", "mirror_k",
              "mirror_v", "kt", "vs", "gemm_q8_0", "gemm_q4_1", "gemm_q6_k", "gemm_q5_1",
              "gemm_q4_k", "attn", "seconds")
PARTS = ("matmul", "attention", "kv_write", "rest")  # what DecodeStack.seconds accumulates


class _Step(ctypes.Structure):  # GsStep of decode_stack_cpu.cpp
    _fields_ = [(name, _i64) for name in _STEP_INTS] + [  # type: ignore[assignment]
        ("eps", ctypes.c_float), ("threads", _i32)] + [(name, _ptr) for name in _STEP_PTRS]


def stack_available() -> bool:
    """Whether :class:`DecodeStack` can run here (building the glue on first call)."""
    return attention_isa() is not None and _open() is not None


class DecodeStack:
    """A model's decoder layers bound to the kernel (the weights' addresses are taken once; the
    tensors must stay alive and in place, which this object ensures by holding them)."""

    def __init__(self, dims: StackDims, layers: list[StackLayer],
                 head: StackHead | None = None) -> None:
        if dims.head_dim not in HEAD_DIMS or dims.heads % dims.kv_heads:
            raise ValueError(f"head_dim must be one of {HEAD_DIMS} and heads a multiple of kv heads")
        lib, isa = _open(), attention_isa()
        if lib is None or isa is None:
            raise RuntimeError("the decode stack kernel is unavailable: "
                               f"{build_error(_SOURCE, 'avx2')}")
        self.dims, self.layers, self._lib = dims, layers, lib
        if head is not None and head.lm_head.bias is not None:
            raise ValueError("the LM head of the decode stack takes no bias")
        self.head = head
        isas = {lin.packed[0].isa for layer in layers for lin in _linears(layer)}
        if head is not None:
            isas.add(head.lm_head.packed[0].isa)
        if len(isas) != 1:
            raise ValueError(f"every projection must be packed for one build, got {sorted(isas)}")
        self._cached_tables: tuple[tuple[object, ...], list[_Table]] | None = None
        self._seconds = (ctypes.c_double * len(PARTS))()
        self._gemms = gemm_addresses(isas.pop())
        self._attn = attention_address(isa)
        self._segments: list[ctypes.Array[_Segment]] = []  # what the _Linear's point to
        self._head_linear = self._linear(head.lm_head) if head is not None else None
        self._layers = (_Layer * len(layers))(*[_Layer(
            layer.norm1.data_ptr(), layer.norm2.data_ptr(),
            *[self._linear(lin) for lin in _linears(layer)]) for layer in layers])

    def run(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: StackKV,
            logit_rows: torch.Tensor | None = None) -> torch.Tensor | None:
        """Run every layer on the new tokens' hidden states ``h [T, hidden]`` (fp32, updated in
        place) with rotary ``cos``/``sin [T, head_dim]``. With ``logit_rows`` (int64 ``[L]``
        rows of ``h``) and a :class:`StackHead`, returns their logits ``[L, vocab]`` (final
        norm, LM head) from the same call; otherwise None."""
        d, n = self.dims, len(self.layers)
        qb, qpos = kv.qb.to(torch.int64).contiguous(), kv.qpos.to(torch.int64).contiguous()
        qlen = qpos + 1
        p = kv.kt[0].shape[2] if kv.kt else 0
        kt, vs = (kv.kt, kv.vs) if kv.kt else (kv.mirror_k, kv.mirror_v)  # unread: P == 0
        for name, t in (("h", h), ("cos", cos), ("sin", sin)):
            if t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu":
                raise ValueError(f"{name} must be contiguous fp32 on CPU")
        slots = kv.slots.to(torch.int64).contiguous()
        tables = self._tables(kv, kt, vs)
        step = _Step(h.shape[0], d.hidden, d.heads, d.kv_heads, d.head_dim, d.inter, n,
                     kv.mirror_v[0].shape[2], p, d.eps, torch.get_num_threads(),
                     cos.data_ptr(), sin.data_ptr(), slots.data_ptr(), qb.data_ptr(),
                     qpos.data_ptr(), qlen.data_ptr(), *[ctypes.addressof(t) for t in tables],
                     *self._gemms, self._attn, ctypes.addressof(self._seconds))
        logits: torch.Tensor | None = None
        head: _Head | None = None
        if logit_rows is not None and self.head is not None:
            rows = logit_rows.to(torch.int64).contiguous()
            logits = torch.empty(rows.numel(), self.head.lm_head.n, dtype=torch.float32)
            head = _Head(self.head.norm.data_ptr(), self._head_linear, rows.data_ptr(),
                         rows.numel(), logits.data_ptr())
        rc = self._lib.gs_decode_stack(ctypes.byref(step), self._layers, h.data_ptr(),
                                       ctypes.byref(head) if head is not None else None)
        if rc == -2:
            raise ValueError(f"logit_rows must index the {h.shape[0]} rows of h")
        if rc:
            raise RuntimeError(f"decode stack kernel failed ({rc})")
        return logits

    @property
    def seconds(self) -> dict[str, float]:
        """Time spent in the kernel so far, by part (:data:`PARTS`; ``rest``: norms, rotary,
        SiLU, residual adds), for profiles and the roofline benchmark."""
        return dict(zip(PARTS, self._seconds))

    def _linear(self, lin: StackLinear) -> _Linear:
        segs = (_Segment * len(lin.packed))(*[_Segment(
            w.qs.data_ptr(), w.d.data_ptr(), w.m.data_ptr() if w.m.numel() else None, w.n,
            KINDS.index(w.kind), w.levels) for w in lin.packed])
        self._segments.append(segs)
        return _Linear(ctypes.addressof(segs), len(lin.packed),
                       lin.bias.data_ptr() if lin.bias is not None else None, lin.n,
                       lin.packed[0].k)

    def _tables(self, kv: StackKV, kt: list[torch.Tensor],
                vs: list[torch.Tensor]) -> list[_Table]:
        """Per-layer address tables of the K/V tensors (reused while ``kv.key`` is the same)."""
        cached = self._cached_tables
        if kv.key is not None and cached is not None and len(cached[0]) == len(kv.key) and all(
                a is b for a, b in zip(cached[0], kv.key)):
            return cached[1]
        tables = [_addresses(t) for t in (kv.pool_k, kv.pool_v, kv.mirror_k, kv.mirror_v, kt, vs)]
        self._cached_tables = (kv.key, tables) if kv.key is not None else None
        return tables


def decode_stack_head_ref(dims: StackDims, head: StackHead, h: torch.Tensor,
                          rows: torch.Tensor) -> torch.Tensor:
    """Reference for the logits :meth:`DecodeStack.run` returns: ``h`` is the new hidden state
    (from :func:`decode_stack_ref`)."""
    return _ref_linear(F.rms_norm(h[rows], (dims.hidden,), head.norm, dims.eps), head.lm_head)


def decode_stack_ref(dims: StackDims, layers: list[StackLayer], h: torch.Tensor,
                     cos: torch.Tensor, sin: torch.Tensor, kv: StackKV) -> torch.Tensor:
    """Reference for :meth:`DecodeStack.run` in torch (returns the new ``h``; writes the same
    pool and mirror entries)."""
    hd, half = dims.head_dim, dims.head_dim // 2
    for i, w in enumerate(layers):
        x = F.rms_norm(h, (dims.hidden,), w.norm1, dims.eps)
        qkv = _ref_linear(x, w.qkv).view(-1, dims.heads + 2 * dims.kv_heads, hd)
        rot = torch.cat((-qkv[..., half:], qkv[..., :half]), -1)
        qkv = torch.cat([qkv[:, :dims.heads + dims.kv_heads] * cos[:, None] +
                         rot[:, :dims.heads + dims.kv_heads] * sin[:, None],
                         qkv[:, dims.heads + dims.kv_heads:]], 1)
        q, k, v = qkv.split([dims.heads, dims.kv_heads, dims.kv_heads], 1)
        kv.pool_k[i][kv.slots], kv.pool_v[i][kv.slots] = k, v
        kv.mirror_k[i][kv.qb, :, kv.qpos // KEY_TILE, :, kv.qpos % KEY_TILE] = k
        kv.mirror_v[i][kv.qb, :, kv.qpos] = v
        kt = kv.kt[i] if kv.kt else h.new_empty(0)
        vs = kv.vs[i] if kv.vs else h.new_empty(0)
        o = decode_attention_ref((q * hd ** -0.5).contiguous(), kt, vs, kv.mirror_k[i],
                                 kv.mirror_v[i], kv.qb, kv.qpos + 1)
        h = h + _ref_linear(o.reshape(h.shape[0], -1), w.o)
        gate, up = _ref_linear(F.rms_norm(h, (dims.hidden,), w.norm2, dims.eps),
                               w.gate_up).split(dims.inter, -1)
        h = h + _ref_linear(F.silu(gate) * up, w.down)
    return h


def _ref_linear(x: torch.Tensor, lin: StackLinear) -> torch.Tensor:
    y = quant_matmul_q8_rows_ref(x, tuple(unpack_x16(p) for p in lin.packed),
                                 lin.packed[0].levels)
    return y if lin.bias is None else y + lin.bias


def _linears(layer: StackLayer) -> list[StackLinear]:
    return [layer.qkv, layer.o, layer.gate_up, layer.down]


def _addresses(tensors: list[torch.Tensor]) -> _Table:
    return (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])


def _open() -> ctypes.CDLL | None:
    return open_cached(_SOURCE, _COMMON, "avx2", declare=_declare)


def _declare(lib: ctypes.CDLL) -> None:
    lib.gs_decode_stack.argtypes = [_ptr, _ptr, _ptr, _ptr]
    lib.gs_decode_stack.restype = ctypes.c_int
