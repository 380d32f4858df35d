"""The GGUF-block kernels against fp32 BLAS on the embedded model's own weights, by row count.

For each row count R, the 120 layer linears of SmolLM2-135M (30 layers x qkv, o, gate_up, down)
are applied once to R random rows, first through the fp32 path a model without blocks takes
(``W @ x.T``, rows padded to a multiple of 8, as ``grammarserve.models.linear`` does) and then
through ``quant_matmul`` on the Q4_1 blocks (fp32 activations), then through
``quant_matmul_q8`` with int8 activations in two levels (``int8x2``, the default) and one
(``int8``) on the instruction set :func:`cpu_isa` picks; the LM head (Q8_0) likewise. The weights stream
from DRAM as in a real step (120 distinct matrices, 420 MB in fp32). Median of ``--repeat`` runs,
in ms; prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
from machine import stamp


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return round(1000 * statistics.median(times), 2)


def _figures(r: int, layers: list, head: torch.nn.Module, repeat: int) -> dict[str, float]:
    """Both paths at ``r`` rows: the 120 layer linears, then the LM head."""
    from grammarserve_kernels.quant import quant_matmul
    from grammarserve_kernels.quant_q8 import pack_x16, quant_matmul_q8_rows

    padded = 4 if r <= 4 else -(-r // 8) * 8
    dense = {id(m): m.dense() for m in [*layers, head]}  # the fp32 baseline's weights
    xs = {k: torch.randn(r, k) for k in {m.weight.shape[1] for m in layers}}
    xp = {k: torch.cat([x, x.new_zeros(padded - r, k)]) for k, x in xs.items()}
    h, hp = torch.randn(r, head.weight.shape[1]), torch.randn(padded, head.weight.shape[1])
    packed = {id(m): tuple(pack_x16(q) for q in m.quant_rows) for m in [*layers, head]}
    q8 = {"int8x2": 2, "int8": 1}
    return {
        **{f"layers_{name}_ms": _median_ms(
            lambda lv=lv: [quant_matmul_q8_rows(xs[m.weight.shape[1]], packed[id(m)], levels=lv)
                           for m in layers], repeat) for name, lv in q8.items()},
        **{f"lm_head_{name}_ms": _median_ms(
            lambda lv=lv: quant_matmul_q8_rows(h, packed[id(head)], levels=lv), repeat)
           for name, lv in q8.items()},
        "layers_fp32_ms": _median_ms(
            lambda: [torch.mm(dense[id(m)], xp[m.weight.shape[1]].t()) for m in layers], repeat),
        "layers_blocks_ms": _median_ms(
            lambda: [quant_matmul(xs[m.weight.shape[1]], m.quant) for m in layers], repeat),
        "lm_head_fp32_ms": _median_ms(lambda: torch.mm(dense[id(head)], hp.t()), repeat),
        "lm_head_blocks_ms": _median_ms(lambda: quant_matmul(h, head.quant), repeat),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,8,16,32,64,128")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from grammarserve_kernels.quant import quant_kernel_available, quant_kernel_error

    from grammarserve.models.linear import Linear
    from grammarserve.models.loader import load_model

    if not quant_kernel_available():
        raise SystemExit(f"the kernel is unavailable here: {quant_kernel_error()}")
    model = load_model("default", quant_activations="fp32").model  # blocks in row layout
    head = model.lm_head
    layers = [m for m in model.modules() if isinstance(m, Linear) and m is not head]
    from grammarserve_kernels.quant_q8 import cpu_isa

    out: dict[str, object] = {"bench": "quant_kernel", "threads": args.threads,
                              "linears": len(layers), "isa": cpu_isa()}
    for r in (int(x) for x in args.rows.split(",")):
        out[f"rows_{r}"] = _figures(r, layers, head, args.repeat)
    print(json.dumps({**stamp(), **out}))


if __name__ == "__main__":
    main()
