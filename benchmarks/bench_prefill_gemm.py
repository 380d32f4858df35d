"""Prefill GEMMs over x16 weights by row count: the int8-activation kernel (``quant_q8``, two
levels and one) against torch's dense GEMM on panels dequantized on the fly (``quant_panel``,
bf16 and fp32), at the 1.7B shapes, to find the row count above which the panel path wins.

Shapes (SmolLM2-1.7B): K=2048 -> N=6144 (qkv), 2048 (o), 16384 (gate_up); K=8192 -> N=2048
(down), each a random weight of each ``--kinds``. For each row count M (``--rows``): useful
GOP/s (``2 * M * N * K`` per product; the fastest of ``--repeat`` timed calls after a warm-up) of
``int8x2``, ``int8``, ``panel_bf16`` and ``panel_fp32``, summed over the four shapes (a layer),
and per shape; ``dequant_share``: the dequantization alone (into the same reused panel) over the
panel product's time. ``rel_err``: each path's relative Frobenius error against the float64
product of the exact weights, on ``--err-rows`` random rows (per row, independent of M).
``panel_rows``: panel_bf16 of the gate_up shape with panels of 256, 512, 1024 rows and the whole
segment at 64, 512 and 2048 rows (the transient a panel costs, in MiB, beside). Prints one JSON
line.

On a shared machine, compare paths within one run, and prefer ``--threads 1``: with 2 threads on
2 busy cores each OpenMP region waits for a descheduled thread, which the panel path (a few
regions per panel) pays far more often than the int8 kernel (one region per product).

    nice -n 10 .venv/bin/python benchmarks/bench_prefill_gemm.py [--rows 16,32,...,2048]
        [--kinds Q4_1,Q6_K] [--repeat 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from functools import partial

import torch
from grammarserve_kernels.quant import dequantize
from grammarserve_kernels.quant_panel import (
    PANEL_ROWS,
    dequantize_x16,
    panel_available,
    panel_error,
    panel_matmul,
    random_quant_weight,
)
from grammarserve_kernels.quant_q8 import PackedWeight, cpu_isa, pack_x16, quant_matmul_q8_rows
from machine import stamp

SHAPES = {"qkv": (2048, 6144), "o": (2048, 2048), "gate_up": (2048, 16384), "down": (8192, 2048)}
PATHS = ("int8x2", "int8", "panel_bf16", "panel_fp32")


def _best_s(fn: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` timed calls after a warm-up: other work on the machine only ever
    slows a call, and a 2-thread call stalls at every OpenMP barrier whose second thread is
    descheduled (see the module docstring)."""
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _paths(w: PackedWeight) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    return {
        "int8x2": lambda x: quant_matmul_q8_rows(x, (w,), levels=2),
        "int8": lambda x: quant_matmul_q8_rows(x, (w,), levels=1),
        "panel_bf16": lambda x: panel_matmul(x, (w,), torch.bfloat16),
        "panel_fp32": lambda x: panel_matmul(x, (w,), torch.float32),
    }


def _dequant_all(w: PackedWeight, dtype: torch.dtype) -> Callable[[], None]:
    """Dequantize every panel of ``w`` into one reused buffer, as :func:`panel_matmul` does."""
    buf = torch.empty(min(PANEL_ROWS, w.n), w.k, dtype=dtype)

    def run() -> None:
        for r0 in range(0, w.n, PANEL_ROWS):
            r1 = min(r0 + PANEL_ROWS, w.n)
            dequantize_x16(w, dtype, slice(r0, r1), buf[:r1 - r0])
    return run


def _errors(kind: str, rows: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, (k, n) in SHAPES.items():
        q = random_quant_weight(kind, n, k, seed=1)
        w = pack_x16(q)
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(2))
        ref = x.double() @ dequantize(q).double().t()
        out[name] = {p: float(f"{float((f(x).double() - ref).norm() / ref.norm()):.3g}")
                     for p, f in _paths(w).items()}
    return out


def _rates(kind: str, rows: list[int], repeat: int) -> dict[str, object]:
    weights = {name: pack_x16(random_quant_weight(kind, n, k)) for name, (k, n) in SHAPES.items()}
    result: dict[str, object] = {}
    for m in rows:
        secs = {p: 0.0 for p in PATHS}
        dq = {"panel_bf16": 0.0, "panel_fp32": 0.0}
        per_shape: dict[str, dict[str, float]] = {}
        flops = 0.0
        for name, w in weights.items():
            x = torch.randn(m, w.k)
            f = 2.0 * m * w.n * w.k
            flops += f
            t = {p: _best_s(partial(fn, x), repeat) for p, fn in _paths(w).items()}
            for p in PATHS:
                secs[p] += t[p]
            for p, dtype in (("panel_bf16", torch.bfloat16), ("panel_fp32", torch.float32)):
                dq[p] += _best_s(_dequant_all(w, dtype), repeat)
            per_shape[name] = {p: round(f / t[p] / 1e9, 1) for p in PATHS}
        result[f"rows_{m}"] = {
            **{f"{p}_gops": round(flops / secs[p] / 1e9, 1) for p in PATHS},
            "layer_ms": {p: round(1000 * secs[p], 1) for p in PATHS},
            "dequant_share": {p: round(dq[p] / secs[p], 3) for p in dq},
            "per_shape_gops": per_shape,
        }
    return result


def _panel_rows(repeat: int) -> dict[str, object]:
    k, n = SHAPES["gate_up"]
    w = pack_x16(random_quant_weight("Q4_1", n, k))
    out: dict[str, object] = {}
    for m in (64, 512, 2048):
        x = torch.randn(m, k)
        out[f"rows_{m}_gops"] = {
            str(p): round(2.0 * m * n * k / _best_s(
                partial(panel_matmul, x, (w,), torch.bfloat16, p), repeat) / 1e9, 1)
            for p in (256, 512, 1024, n)}
    out["panel_mib"] = {str(p): round(p * k * 2 / 2**20, 1) for p in (256, 512, 1024, n)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="16,32,64,128,256,512,2048")
    ap.add_argument("--kinds", default="Q4_1,Q6_K")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--err-rows", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-panel-rows", action="store_true", help="skip the panel size sweep")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not panel_available():
        raise SystemExit(f"the panel kernel is unavailable here: {panel_error()}")
    rows = [int(r) for r in args.rows.split(",")]
    out: dict[str, object] = {"bench": "prefill_gemm", "threads": args.threads, "isa": cpu_isa(),
                              "panel_rows": PANEL_ROWS, "shapes": SHAPES}
    for kind in args.kinds.split(","):
        out[kind] = {"rel_err": _errors(kind, args.err_rows), **_rates(kind, rows, args.repeat)}
    if not args.no_panel_rows:
        out["panel_rows_sweep"] = _panel_rows(args.repeat)
    print(json.dumps({**stamp(), **out}))


if __name__ == "__main__":
    main()
