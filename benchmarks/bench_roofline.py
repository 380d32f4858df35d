"""Roofline of the CPU decode step: the machine's measured peaks, and how close a decode step at
1, 8, 32 and 64 rows (and a prefill chunk) comes to them, per component.

Decode steps run all layers in one C++ call (``kernels/decode_stack_cpu.cpp``), which times its
own parts (``DecodeStack.seconds``, the LM head included): the matmul and attention times of a
step are those (plus any matmul timed from Python, on paths without the kernel); ``rest`` is the
step minus both (norms, rotary, K/V writes, sampling, the engine's Python).

Peaks, measured here (``_Peaks``: the best of measurements at the start and around each row
count, since the shared host's speed moves): fp32 FMA GFLOP/s and int8 multiply-add GOP/s per
instruction set this CPU runs, and memory read GB/s. Per step (the quietest of ``--windows``
windows of ``--steps`` steps), on the embedded model (prefix cache off, every row its own
``--context``-token prompt): the time in the quantized matmuls, in attention and in the rest,
and each component's roofline estimate: max(bytes it must read / GB/s, operations / peak), with
the bytes and operations counted from the shapes (matmuls: the packed weights and
2 * N * K * rows products per int8 level; attention: each row's K/V in fp32 and
4 * context * heads * head_dim FLOPs per row and layer, at the window's mean context).
``ratio`` = measured / estimate; ``tok_s_at_roofline`` = rows / (matmul + attention estimates),
the most a step of that many rows could give.

    .venv/bin/python benchmarks/bench_roofline.py [--threads 2] [--context 512] [--rows 1,8,32,64]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from machine import stamp

HERE = Path(__file__).resolve().parent


class _Peaks:
    """The machine's peaks, as the best of every measurement in the run: the host is shared and
    its speed moves (memory 27-57 GB/s seen on one machine, nothing of ours running), so they
    are measured at the start and again around each row count, and every estimate uses the best.

    Compute: independent register-only chains on every thread (``roofline/peak.cpp``). Memory:
    every thread streaming its share of 512 MB as 1, 2 or 4 interleaved streams
    (``gs_peak_read``)."""

    def __init__(self, threads: int) -> None:
        from grammarserve_kernels import quant_q8
        from grammarserve_kernels.cpu_build import build_and_open

        self.threads, self.libs = threads, {}
        for isa in quant_q8.supported_isas():
            lib = build_and_open(HERE / "roofline" / "peak.cpp",
                                 quant_q8._COMMON + quant_q8._ISA_FLAGS[isa], tag=isa)
            lib.gs_peak_fma.restype, lib.gs_peak_int8.restype = ctypes.c_float, ctypes.c_int
            lib.gs_peak_fma.argtypes = lib.gs_peak_int8.argtypes = [ctypes.c_int64, ctypes.c_int]
            lib.gs_peak_read.restype = ctypes.c_float
            lib.gs_peak_read.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int,
                                         ctypes.c_int, ctypes.c_int]
            self.libs[isa] = lib
        self.x = torch.ones(128 * 1024 * 1024)  # 512 MB, far past the caches
        self.best: dict[str, float] = {}

    def _keep(self, key: str, value: float) -> float:
        self.best[key] = max(self.best.get(key, 0.0), value)
        return value

    def measure(self, reps: int = 1) -> float:
        """Measure every peak ``reps`` times; returns this measurement's memory GB/s."""
        iters = 20_000_000
        for isa, lib in self.libs.items():
            lanes = 16 if isa.startswith("avx512") else 8
            for _ in range(reps):
                t0 = time.perf_counter()
                lib.gs_peak_fma(iters, self.threads)
                dt = time.perf_counter() - t0
                self._keep(f"{isa}.fma_gflops", self.threads * iters * 12 * lanes * 2 / dt / 1e9)
                t0 = time.perf_counter()
                lib.gs_peak_int8(iters, self.threads)
                dt = time.perf_counter() - t0
                self._keep(f"{isa}.int8_gops", self.threads * iters * 12 * lanes * 8 / dt / 1e9)
        lib, gbs = next(iter(self.libs.values())), 0.0
        for _ in range(reps):
            for streams in (1, 2, 4):
                t0 = time.perf_counter()
                lib.gs_peak_read(self.x.data_ptr(), self.x.numel(), self.threads, streams, 0)
                gbs = max(gbs, self.x.numel() * 4 / (time.perf_counter() - t0) / 1e9)
        return round(self._keep("mem_read_gbs", gbs), 1)

    def values(self) -> dict[str, Any]:
        """The best of each peak so far, as ``{isa: {fma_gflops, int8_gops}, mem_read_gbs}``."""
        out: dict[str, Any] = {"mem_read_gbs": round(self.best["mem_read_gbs"], 1)}
        for key, v in self.best.items():
            if "." in key:
                isa, name = key.split(".")
                out.setdefault(isa, {})[name] = round(v, 1)
        return out


class _Timers:
    """Wall time inside the quantized matmuls and attention (the model calls them through
    module-level names, which are wrapped here)."""

    def __init__(self) -> None:
        from grammarserve.attention import backend
        from grammarserve.models import linear

        self.acc: defaultdict[str, float] = defaultdict(float)
        for name in ("quant_matmul_q8_rows", "quant_matmul"):
            setattr(linear, name, self._wrap(getattr(linear, name), "matmul"))
        cls = backend.TorchSDPABackend
        cls.forward = self._wrap(cls.forward, "attention")  # type: ignore[method-assign]

    def _wrap(self, fn: Any, key: str) -> Any:
        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            r = fn(*a, **k)
            self.acc[key] += time.perf_counter() - t0
            return r
        return timed


def _model_shapes(llm: Any) -> dict[str, Any]:
    from grammarserve.models.linear import Linear

    model = llm.engine.loaded.model
    body = head = 0
    body_params = head_params = 0
    levels = 0
    for name, m in model.named_modules():
        if isinstance(m, Linear):
            parts = m.quant_x16 if m.quant_x16 is not None else m.quant_rows
            nbytes = sum(t.numel() * t.element_size() for p in parts
                         for t in (p.qs, p.d, p.m)) if parts else m.weight.numel() * 4
            if m.quant_x16 is not None:
                levels = m.quant_x16[0].levels
            if name == "lm_head":
                head, head_params = nbytes, m.weight.numel()
            else:
                body += nbytes
                body_params += m.weight.numel()
    mc = llm.engine.loaded.config
    return {"body_bytes": body, "head_bytes": head, "body_params": body_params,
            "head_params": head_params, "levels": levels, "layers": mc.num_layers,
            "heads": mc.num_heads, "kv_heads": mc.num_kv_heads, "head_dim": mc.head_dim}


def _estimate(sh: dict[str, Any], rows: int, logit_rows: int, ctx: int, peaks: dict[str, Any],
              isa: str) -> dict[str, float]:
    """Roofline seconds of the matmuls and the attention of one forward."""
    bw = peaks["mem_read_gbs"] * 1e9
    levels = sh["levels"]
    mm_ops = 2 * (sh["body_params"] * rows + sh["head_params"] * logit_rows)
    peak = (peaks[isa]["int8_gops"] / max(levels, 1)) if levels else peaks[isa]["fma_gflops"]
    mm = max((sh["body_bytes"] + sh["head_bytes"]) / bw, mm_ops / (peak * 1e9))
    kv_bytes = sh["layers"] * rows * ctx * sh["kv_heads"] * sh["head_dim"] * 4 * 2
    flops = sh["layers"] * rows * ctx * sh["heads"] * sh["head_dim"] * 4
    att = max(kv_bytes / bw, flops / (peaks[isa]["fma_gflops"] * 1e9))
    return {"matmul": mm, "attention": att}


def _decode(llm: Any, timers: _Timers, rows: int, ctx: int, steps: int,
            windows: int) -> dict[str, float]:
    """One decode step's seconds (the quietest of ``windows`` windows): the whole step, and inside it the quantized matmuls and the
    attention, as the decode-stack kernel times its own parts (``DecodeStack.seconds``) plus the
    LM head (timed from Python); ``rest`` is everything else (norms, rotary, K/V writes,
    sampling, the engine's Python)."""
    from grammarserve import SamplingParams

    eng = llm.engine
    stack = eng.loaded.model.decode_stack
    gen = torch.Generator().manual_seed(rows)
    for i in range(rows):
        ids = torch.randint(100, 40000, (ctx,), generator=gen).tolist()
        eng.add_request(f"r{rows}-{i}", ids, SamplingParams(max_tokens=windows * steps + 8,
                                                             temperature=0,
                                                             ignore_eos=True))
    while eng.scheduler.waiting or any(r.num_computed < len(r.prompt_ids) for r in
                                       eng.scheduler.running):
        eng.step()
    eng.step()
    best: dict[str, float] | None = None
    for w in range(windows):  # the quietest window of `steps` steps: the machine is shared
        timers.acc.clear()
        before = dict(stack.seconds) if stack is not None else {}
        t0 = time.perf_counter()
        for _ in range(steps):
            eng.step()
        total = (time.perf_counter() - t0) / steps
        after = dict(stack.seconds) if stack is not None else {}
        inside = {k: (after[k] - before[k]) / steps for k in after}
        m = inside.get("matmul", 0.0) + timers.acc["matmul"] / steps
        a = inside.get("attention", 0.0) + timers.acc["attention"] / steps
        if best is None or total < best["step"]:
            best = {"step": total, "matmul": m, "attention": a, "rest": total - m - a,
                    "context": ctx + 2 + w * steps + steps / 2}  # the window's mean context
    while eng.has_unfinished():
        eng.step()
    assert best is not None
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--rows", default="1,8,32,64")
    ap.add_argument("--steps", type=int, default=16, help="decode steps per window")
    ap.add_argument("--windows", type=int, default=3, help="windows per row count (the "
                    "quietest is reported)")
    ap.add_argument("--prefill", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from grammarserve_kernels.quant_q8 import cpu_isa

    from grammarserve import LLM, SamplingParams

    peaks = _Peaks(args.threads)
    peaks.measure(reps=3)
    isa = cpu_isa() or "avx2"
    rows_list = [int(r) for r in args.rows.split(",")]
    tokens = max(rows_list) * (args.context + args.windows * args.steps + 16 + 64)  # + headroom
    llm = LLM("default", device="cpu", max_num_reqs=max(rows_list), enable_prefix_cache=False,
              kv_cache_tokens=tokens + 4096, decode_mirror_tokens=tokens)
    timers = _Timers()
    sh = _model_shapes(llm)
    out: dict[str, Any] = {"bench": "roofline", "isa": isa,
                           "threads": args.threads, "context": args.context,
                           "activation_levels": sh["levels"], "steps": []}
    llm.generate([[5] * 32], SamplingParams(max_tokens=2, temperature=0))  # warm-up
    measured = []
    for rows in rows_list:
        before = peaks.measure()
        meas = _decode(llm, timers, rows, args.context, args.steps, args.windows)
        measured.append((rows, meas, max(before, peaks.measure())))
    best = peaks.values()
    out["peaks"] = best
    for rows, meas, beside in measured:
        est = _estimate(sh, rows, rows, round(meas["context"]), best, isa)
        row: dict[str, Any] = {"rows": rows, "step_ms": round(meas["step"] * 1e3, 2),
                               "tok_s": round(rows / meas["step"], 1),
                               "mem_read_gbs_beside": beside}
        for part in ("matmul", "attention"):
            row[part] = {"ms": round(meas[part] * 1e3, 2), "roofline_ms": round(est[part] * 1e3, 2),
                         "ratio": round(meas[part] / max(est[part], 1e-9), 2)}
        row["rest_ms"] = round(meas["rest"] * 1e3, 2)
        row["step_vs_roofline"] = round(meas["step"] / (est["matmul"] + est["attention"]), 2)
        # NOTE: past a few rows the matmuls are compute-bound, so this is flat in the rows: no
        # batch size can give more tokens/s than it, whatever the smaller ones give
        row["tok_s_at_roofline"] = round(rows / (est["matmul"] + est["attention"]), 1)
        out["steps"].append(row)
    ids = torch.randint(100, 40000, (args.prefill,)).tolist()
    timers.acc.clear()
    t0 = time.perf_counter()
    llm.generate([ids], SamplingParams(max_tokens=1, temperature=0))
    dt = time.perf_counter() - t0
    est = _estimate(sh, args.prefill, 1, args.prefill // 2, best, isa)
    out["prefill"] = {"tokens": args.prefill, "ms": round(dt * 1e3, 1),
                      "matmul_ms": round(timers.acc["matmul"] * 1e3, 1),
                      "matmul_roofline_ms": round(est["matmul"] * 1e3, 1),
                      "attention_ms": round(timers.acc["attention"] * 1e3, 1),
                      "tok_s": round(args.prefill / dt, 1)}
    print(json.dumps({**stamp(), **out}))


if __name__ == "__main__":
    main()
