"""Give a CPU model's linears (and its token embedding) the GGUF's own quantized blocks: the one
copy of those weights the model keeps.

Each linear whose GGUF tensors all have a kernel (``quant.PACKED_TYPES``: Q4_K, Q6_K, Q5_K,
Q8_0, Q4_1, Q5_1 and Q4_0 / Q5_0 repacked losslessly into the Q4_1 / Q8_0 layouts) gets :class:`~grammarserve_kernels.quant.QuantWeight` row segments of the
same values, fused like the fp32 weight would be (q/k/v and gate/up concatenated, llama's Q/K row
permutation undone; one segment per run of one layout); the loader then never reads those
weights dense (:func:`load_gguf_blocks` before loading says which). With int8 activations (the
default) the segments are kept only interleaved by 16 rows for the integer kernel
(``kernels/quant_q8_cpu.cpp``), with fp32 activations only in row layout. The embedding of a type
with a layout becomes a :class:`~grammarserve.models.quant_embedding.QuantEmbedding`. Decode steps
are bound by the weight bytes they stream, and the blocks are 3-6x smaller than fp32.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from grammarserve_kernels.quant import (
    PACKED_TYPES,
    QuantWeight,
    as_q4_1,
    pack_gguf_blocks,
    quant_kernel_available,
)
from grammarserve_kernels.quant_panel import amx_granted, panel_available, panel_error
from grammarserve_kernels.quant_q8 import cpu_isa, pack_x16

from grammarserve.models.decode_stack import bind_decode_stack
from grammarserve.models.gguf_convert import read_gguf, unpermute_rows
from grammarserve.models.linear import PREFILL_AUTO_FALLBACK, PREFILL_MATMULS, Linear
from grammarserve.models.llama import LlamaModel
from grammarserve.models.quant_embedding import QuantEmbedding

log = logging.getLogger(__name__)
_CACHE_FILE = Path("blocks") / "gguf-blocks-v7.safetensors"  # not globbed with the weights
EMBEDDING = "embed_tokens"  # the blocks' name of the token embedding
_FUSED = {  # our linear (per layer) -> the GGUF tensors whose rows it concatenates
    "self_attn.qkv_proj": ("attn_q", "attn_k", "attn_v"),
    "self_attn.o_proj": ("attn_output",),
    "mlp.gate_up_proj": ("ffn_gate", "ffn_up"),
    "mlp.down_proj": ("ffn_down",),
}


@dataclasses.dataclass
class GGUFBlocks:
    """A GGUF's weights in kernel layouts: our module name (a linear, or :data:`EMBEDDING`) ->
    row segments, and the GGUF types left without a kernel -> their weights' element count.
    Read from the block cache, a segment is read when taken; :func:`attach_gguf_blocks` takes
    them out (the model then holds the only copy)."""

    packed: MutableMapping[str, tuple[QuantWeight, ...]]
    unpacked: dict[str, int]

    def weight_names(self) -> frozenset[str]:
        """The model's state-dict entries these blocks stand for (not to be loaded dense)."""
        return frozenset(f"{name}.weight" for name in self.packed)


class _CachedRows(MutableMapping[str, tuple[QuantWeight, ...]]):
    """The segments of a block cache file by name, each read from the (mapped) file on access,
    so that a model's loading never holds all of them beside their packed layout."""

    def __init__(self, handle: Any, kinds: dict[str, list[str]]) -> None:
        self._file, self._kinds = handle, kinds

    def __getitem__(self, name: str) -> tuple[QuantWeight, ...]:
        # NOTE: cloned: a tensor viewing the mapped file would keep the whole mapping, and every
        # page loading touched, resident beside the packed copy (an 8B model: 4.8 GB more RSS)
        return tuple(QuantWeight(kind, *(self._file.get_tensor(f"{name}.{i}.{part}").clone()
                                         for part in ("qs", "d", "m")))
                     for i, kind in enumerate(self._kinds[name]))

    def __setitem__(self, name: str, rows: tuple[QuantWeight, ...]) -> None:
        raise TypeError("a block cache file is read-only")

    def __delitem__(self, name: str) -> None:
        del self._kinds[name]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._kinds))

    def __len__(self) -> int:
        return len(self._kinds)

    def shapes(self, name: str) -> list[tuple[int, int]]:
        """The segments' ``(N, K)`` without reading them."""
        return [QuantWeight(kind, torch.empty(0), torch.empty(
            self._file.get_slice(f"{name}.{i}.d").get_shape(), device="meta"),
            torch.empty(0)).shape for i, kind in enumerate(self._kinds[name])]


def load_gguf_blocks(model: LlamaModel, gguf_path: Path, cache: Path | None = None
                     ) -> GGUFBlocks | None:
    """The blocks of ``gguf_path`` that fit ``model`` (built on any device, even ``meta``), or
    None where the kernel cannot run here. ``cache`` (the converted model folder) keeps them in
    ``blocks/``: parsing the GGUF's metadata (its whole vocabulary) takes seconds, reading the
    cache does not."""
    if not quant_kernel_available():
        return None
    file = cache / _CACHE_FILE if cache is not None else None
    found = _read_cache(file) if file is not None else None
    if found is None:
        found = _pack_from_gguf(gguf_path, len(model.layers))
        if file is not None:
            _write_cache(file, found)
            found = _read_cache(file) or found  # read back lazily: the packed rows are freed
    packed, unpacked = found
    for name in list(packed):
        shapes = (packed.shapes(name) if isinstance(packed, _CachedRows)
                  else [q.shape for q in packed[name]])
        if not _fits(model, name, shapes):
            del packed[name]
    return GGUFBlocks(packed, unpacked)


def _fits(model: LlamaModel, name: str, shapes: list[tuple[int, int]]) -> bool:
    module = model.get_submodule(name)
    if name == EMBEDDING:
        return len(shapes) == 1 and shapes[0] == tuple(module.weight.shape)
    n, k = module.weight.shape if isinstance(module, Linear) else (0, 0)
    return sum(r for r, _ in shapes) == n and all(c == k for _, c in shapes)


def attach_gguf_blocks(model: LlamaModel, blocks: GGUFBlocks, activations: str = "int8x2"
                       ) -> int:
    """Give ``model`` the segments of ``blocks`` (taken out of it), in the layout
    ``activations`` multiplies (see :func:`set_quant_activations`); returns how many linears
    got blocks. Types without a kernel are logged as a warning naming them and the fp32 bytes
    their linears decode through."""
    levels = _levels(activations)
    attached = 0
    for name in list(blocks.packed):
        rows = blocks.packed.pop(name)
        if name == EMBEDDING:
            model.embed_tokens = QuantEmbedding(rows[0])
            continue
        linear = model.get_submodule(name)
        assert isinstance(linear, Linear)
        _set_layout(linear, rows, levels)
        attached += 1
    _report(attached, blocks.unpacked)
    model.decode_stack = bind_decode_stack(model)
    return attached


def _report(attached: int, unpacked: dict[str, int]) -> None:
    if not unpacked:
        log.info("GGUF blocks on %d linears; every quantized type has a kernel", attached)
        return
    fp32 = 4 * sum(unpacked.values())
    log.warning("GGUF blocks on %d linears; no kernel for %s: their linears decode through an "
                "fp32 copy (%.2f GB, ~4-7x the bytes a token streams, and slower per byte)",
                attached, ", ".join(sorted(unpacked)), fp32 / 1e9)


ACTIVATIONS = {"int8x2": 2, "int8": 1, "fp32": 0}  # -> int8 levels (0: the fp32 kernel)


def _levels(activations: str) -> int:
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {', '.join(ACTIVATIONS)}, got "
                         f"{activations!r}")
    return ACTIVATIONS[activations] if cpu_isa() is not None else 0


def _set_layout(linear: Linear, rows: tuple[QuantWeight, ...], levels: int) -> None:
    """Keep ``rows`` in the one layout ``levels`` multiplies (x16 for int8, rows for fp32)."""
    if levels:
        linear.quant_x16 = tuple(pack_x16(q, levels=levels) for q in rows)
        linear.quant_rows = ()
    else:  # the fp32-activation kernel multiplies Q4_K in the Q4_1 layout (the same values)
        linear.quant_rows, linear.quant_x16 = tuple(as_q4_1(q) for q in rows), None


def set_quant_activations(model: LlamaModel, activations: str) -> str:
    """Run ``model``'s quantized linears with ``activations``: ``"int8x2"`` (int8 plus the int8
    residual: ~2e-5 relative error per product), ``"int8"`` (llama.cpp's Q8 activations, ~5e-3)
    or ``"fp32"`` (exact). Returns the mode in use: ``"fp32"`` where the int8 kernel cannot be
    built here."""
    levels = _levels(activations)
    for module in model.modules():
        if not isinstance(module, Linear):
            continue
        if levels and module.quant_x16 is not None:  # same layout, other levels
            module.quant_x16 = tuple(dataclasses.replace(p, levels=levels)
                                     for p in module.quant_x16)
        elif rows := module.quant_rows:
            _set_layout(module, rows, levels)
    model.decode_stack = bind_decode_stack(model)
    return activations if levels else "fp32"


def set_prefill_matmul(model: LlamaModel, mode: str) -> str:
    """Run ``model``'s batches of ``PREFILL_ROWS`` rows and more with ``mode`` (one of
    ``linear.PREFILL_MATMULS``, or ``"auto"``; see ``Linear``); returns the mode in use:
    ``"auto"`` is ``"bf16"`` where AMX tiles are granted and the panel kernel builds, else
    ``linear.PREFILL_AUTO_FALLBACK``; ``"bf16"`` becomes ``"int8"`` where the panel kernel
    cannot be built here."""
    if mode == "auto":
        mode = "bf16" if amx_granted() and panel_available() else PREFILL_AUTO_FALLBACK
    if mode not in PREFILL_MATMULS:
        raise ValueError(f"prefill_matmul must be one of {', '.join(PREFILL_MATMULS)}, got "
                         f"{mode!r}")
    if mode == "bf16" and not panel_available():
        log.warning("no bf16 panel kernel here (%s): prefill uses one int8 level",
                    panel_error())
        mode = "int8"
    for module in model.modules():
        if isinstance(module, Linear):
            module.prefill_matmul = mode
    model.prefill_matmul = mode
    return mode


def _pack_from_gguf(gguf_path: Path, num_layers: int
                    ) -> tuple[dict[str, tuple[QuantWeight, ...]], dict[str, int]]:
    """Our linear name -> its blocks as row segments (fused and unpermuted like the fp32
    weights; adjacent parts of one layout share a segment), and the GGUF types left without
    blocks -> their weights' element count."""
    reader = read_gguf(gguf_path)
    tensors = {t.name: t for t in reader.tensors}
    arch = reader.fields["general.architecture"].contents()
    n_head = int(reader.fields[f"{arch}.attention.head_count"].contents())
    kv_field = reader.fields.get(f"{arch}.attention.head_count_kv")
    n_kv = int(kv_field.contents()) if kv_field is not None else n_head
    packed: dict[str, tuple[QuantWeight, ...]] = {}
    unpacked: dict[str, int] = {}

    def pack(name: str, gguf_names: list[str]) -> None:
        found = [tensors[g] for g in gguf_names if g in tensors]
        if len(found) != len(gguf_names):
            return
        other = [t for t in found if t.tensor_type.name not in PACKED_TYPES]
        for t in other:
            unpacked[t.tensor_type.name] = unpacked.get(t.tensor_type.name, 0) + int(t.n_elements)
        if other:
            return
        parts = []
        for g, t in zip(gguf_names, found, strict=True):
            raw = np.asarray(t.data)
            if arch in ("llama", "mistral") and g.endswith((".attn_q.weight", ".attn_k.weight")):
                raw = unpermute_rows(raw, n_head if ".attn_q." in g else n_kv)
            parts.append(pack_gguf_blocks(t.tensor_type.name, raw))
        packed[name] = _segments(parts)

    for i in range(num_layers):
        for module_name, gguf_parts in _FUSED.items():
            pack(f"layers.{i}.{module_name}", [f"blk.{i}.{p}.weight" for p in gguf_parts])
    pack("lm_head", ["output.weight" if "output.weight" in tensors else "token_embd.weight"])
    embed = tensors.get("token_embd.weight")
    if embed is not None and embed.tensor_type.name in PACKED_TYPES:
        packed[EMBEDDING] = (packed["lm_head"] if "output.weight" not in tensors
                             and "lm_head" in packed else
                             (pack_gguf_blocks(embed.tensor_type.name, np.asarray(embed.data)),))
    return packed, unpacked


def _segments(parts: list[QuantWeight]) -> tuple[QuantWeight, ...]:
    """Adjacent parts of one layout concatenated (Q4_K and Q4_1 parts share one)."""
    runs: list[list[QuantWeight]] = []
    for q in parts:
        if runs and runs[-1][0].kind == q.kind:
            runs[-1].append(q)
        else:
            runs.append([q])
    return tuple(run[0] if len(run) == 1 else
                 QuantWeight(run[0].kind, *(torch.cat([getattr(q, f) for q in run])
                                            for f in ("qs", "d", "m")))
                 for run in runs)


def _read_cache(file: Path
                ) -> tuple[MutableMapping[str, tuple[QuantWeight, ...]], dict[str, int]] | None:
    from safetensors import SafetensorError, safe_open

    if not file.is_file():
        return None
    try:
        handle = safe_open(str(file), framework="pt")
        meta = handle.metadata() or {}
        kinds: dict[str, list[str]] = json.loads(meta["kinds"])
        names = set(handle.keys())
        if any(f"{n}.{i}.{part}" not in names for n, segment_kinds in kinds.items()
               for i in range(len(segment_kinds)) for part in ("qs", "d", "m")):
            return None
        return (_CachedRows(handle, kinds),
                {str(k): int(v) for k, v in json.loads(meta["unpacked"]).items()})
    except (SafetensorError, OSError, KeyError, ValueError, TypeError, AttributeError):
        return None  # unreadable: rebuilt from the GGUF (and rewritten)


def _write_cache(file: Path,
                 found: tuple[MutableMapping[str, tuple[QuantWeight, ...]], dict[str, int]]
                 ) -> None:
    from safetensors.torch import save_file

    packed, unpacked = found
    seen: set[int] = set()

    def own(t: torch.Tensor) -> torch.Tensor:  # safetensors refuses tensors sharing storage
        t = t.contiguous()
        if t.numel() and t.data_ptr() in seen:
            return t.clone()
        seen.add(t.data_ptr())
        return t

    tensors = {f"{name}.{i}.{part}": own(getattr(q, part))
               for name, rows in packed.items() for i, q in enumerate(rows)
               for part in ("qs", "d", "m")}
    file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".tmp", dir=file.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={
            "kinds": json.dumps({n: [q.kind for q in rows] for n, rows in packed.items()}),
            "unpacked": json.dumps(unpacked)})
        os.replace(tmp, file)
    except OSError:
        pass  # a read-only cache only costs the next start the GGUF parse
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
