"""Two builds of ``kernels/quant_q8_cpu.cpp`` side by side in one process: the source at git
revision ``--base`` against the working copy, on the embedded model's 120 layer linears + LM head
(int8 activations, ``--levels``), interleaved A/B/B/A so that a noisy machine hurts both alike.

For each row count: the minimum and median ms of the whole set of linears per build, and the
largest relative difference between the two builds' outputs. Prints one JSON line::

    .venv/bin/python benchmarks/ab_quant_kernel.py --base HEAD~1 [--rows 1,8,64] [--threads 2]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from machine import stamp

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "kernels/quant_q8_cpu.cpp"


def _open(src: Path, tag: str) -> Any:
    from grammarserve_kernels import quant_q8 as q
    from grammarserve_kernels.cpu_build import build_and_open

    isa = q.cpu_isa()
    if isa is None:
        raise SystemExit(f"the int8 kernel is unavailable here: {q.kernel_error()}")
    lib = build_and_open(src, q._COMMON + q._ISA_FLAGS[isa], tag=tag)
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    # sources since the row segments take the output's row stride (ldy) after y
    lib.ldy = "int64_t ldy" in src.read_text()
    stride = [i64] if lib.ldy else []
    lib.gs_q4_1_gemm_q8.argtypes = [ptr, i64, i64, ptr, ptr, ptr, i64, ptr, *stride, i32, i32]
    lib.gs_q8_0_gemm_q8.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, *stride, i32, i32]
    # NOTE: Q6_K's entry takes its int8 scales (m) after d since its compact layout
    lib.gs_q6_k_gemm_q8.argtypes = [ptr, i64, i64, ptr, ptr, ptr, i64, ptr, *stride, i32, i32]
    return lib


def _run(lib: Any, packed: list[Any], xs: list[torch.Tensor], ys: list[torch.Tensor],
         threads: int, levels: int) -> None:
    for w, x, y in zip(packed, xs, ys):
        out = (y.data_ptr(), w.n) if lib.ldy else (y.data_ptr(),)
        if w.kind == "Q4_1":
            lib.gs_q4_1_gemm_q8(x.data_ptr(), x.shape[0], w.k, w.qs.data_ptr(), w.d.data_ptr(),
                                w.m.data_ptr(), w.n, *out, threads, levels)
        elif w.kind == "Q6_K":
            lib.gs_q6_k_gemm_q8(x.data_ptr(), x.shape[0], w.k, w.qs.data_ptr(), w.d.data_ptr(),
                                w.m.data_ptr(), w.n, *out, threads, levels)
        else:
            lib.gs_q8_0_gemm_q8(x.data_ptr(), x.shape[0], w.k, w.qs.data_ptr(), w.d.data_ptr(),
                                w.n, *out, threads, levels)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="HEAD", help="git revision of build A (B: the working copy)")
    ap.add_argument("--rows", default="1,8,64")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--levels", type=int, default=2, choices=(1, 2))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from grammarserve_kernels.quant_q8 import cpu_isa, pack_x16

    from grammarserve.models.linear import Linear
    from grammarserve.models.loader import load_model

    base = subprocess.run(["git", "show", f"{args.base}:{SOURCE}"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        src_a = Path(tmp) / "quant_q8_cpu.cpp"
        src_a.write_text(base)
        libs = {"A": _open(src_a, "abA"), "B": _open(ROOT / SOURCE, "abB")}
    model = load_model("default").model
    packed = [pack_x16(q) for m in model.modules() if isinstance(m, Linear) for q in m.quant_rows]
    out: dict[str, Any] = {"bench": "ab_quant_kernel", "base": args.base, "isa": cpu_isa(),
                           "threads": args.threads, "levels": args.levels,
                           "linears": len(packed), "rows": {}}
    for r in (int(v) for v in args.rows.split(",")):
        xs = [torch.randn(r, w.k) for w in packed]
        ys = {t: [torch.empty(r, w.n) for w in packed] for t in "AB"}
        times: dict[str, list[float]] = {"A": [], "B": []}
        for i in range(args.repeat):
            for t in ("AB" if i % 2 == 0 else "BA"):
                t0 = time.perf_counter()
                _run(libs[t], packed, xs, ys[t], args.threads, args.levels)
                times[t].append(time.perf_counter() - t0)
        diff = max(float((a - b).abs().max() / (a.abs().max() + 1e-9))
                   for a, b in zip(ys["A"], ys["B"]))
        out["rows"][r] = {**{f"{t}_min_ms": round(1e3 * min(v), 2) for t, v in times.items()},
                          **{f"{t}_median_ms": round(1e3 * statistics.median(v), 2)
                             for t, v in times.items()},
                          "max_rel_diff": float(f"{diff:.2e}")}
    print(json.dumps({**stamp(), **out}))


if __name__ == "__main__":
    main()
