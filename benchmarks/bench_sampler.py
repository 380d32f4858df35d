"""Sampling step under a token bitmask: the fused mask + sample path vs the unfused one.

Fused: ``grammarserve.engine.sampler.sample`` (what the engine runs each step: stream keys, the
fused kernel, token ids and log-probabilities back as lists). Unfused:
``xgrammar.apply_token_bitmask_inplace`` on a copy of the logits, then temperature, ``softmax``
and ``multinomial``. Every row is constrained (a random mask with ``--density`` of the tokens
allowed) and sampled at temperature 0.8; logits are fp32. Both sides run interleaved, so machine
noise hits them alike; prints one JSON line with the per-step milliseconds (median and min).
Runs on CUDA when present (Triton kernel vs xgrammar's CUDA mask + torch), else on CPU.

``--greedy``: temperature 0 instead (the engine's all-greedy path: on CPU the ``greedy_cpu.cpp``
kernel); unfused is then the mask, ``argmax`` and the token's ``log_softmax``, as the sampler
reports a log-probability for every token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import xgrammar
from machine import stamp

from grammarserve.engine.sampler import RowRng, sample
from grammarserve.sampling_params import SamplingParams

TEMPERATURE = 0.8


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def bench(batch: int, vocab: int, density: float, iters: int,
          device: torch.device, temperature: float) -> dict[str, Any]:
    g = torch.Generator().manual_seed(batch * 7 + vocab)
    logits = (torch.randn(batch, vocab, generator=g) * 3).to(device)
    allowed = torch.rand(batch, (vocab + 31) // 32 * 32, generator=g) < density
    bits = (allowed.view(batch, -1, 32).long() << torch.arange(32)).sum(-1)
    bitmask = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32).to(device)
    params = [SamplingParams(temperature=temperature)] * batch
    rngs: list[RowRng | None] = [RowRng(seed) for seed in range(batch)]

    def fused() -> object:
        return sample(logits, params, rngs, bitmask)

    def unfused() -> object:
        masked = logits.clone()
        xgrammar.apply_token_bitmask_inplace(masked, bitmask)
        if temperature == 0:
            ids = masked.argmax(dim=-1)
            logprobs = torch.log_softmax(masked, dim=-1).gather(1, ids[:, None])
            return ids.tolist(), logprobs.tolist()
        probs = torch.softmax(masked / temperature, dim=-1)
        return torch.multinomial(probs, 1)[:, 0].tolist()

    fused(), unfused()  # warm-up (Triton compile on CUDA)
    t_fused, t_unfused = [], []
    for _ in range(iters):
        t_fused.append(_timed(fused, device))
        t_unfused.append(_timed(unfused, device))
    med_f, med_u = statistics.median(t_fused), statistics.median(t_unfused)
    return {"batch": batch, "vocab": vocab, "fused_ms": round(med_f, 3),
            "unfused_ms": round(med_u, 3), "ratio": round(med_f / med_u, 3),
            "fused_min_ms": round(min(t_fused), 3), "unfused_min_ms": round(min(t_unfused), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--vocabs", default="49152,151936")
    ap.add_argument("--density", type=float, default=0.5, help="fraction of tokens allowed")
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default)")
    ap.add_argument("--greedy", action="store_true", help="temperature 0 (see the docstring)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    temperature = 0.0 if args.greedy else TEMPERATURE
    results = [bench(b, v, args.density, args.iters, device, temperature)
               for v in map(int, args.vocabs.split(",")) for b in map(int, args.batches.split(","))]
    print(json.dumps({**stamp(), "bench": "sampler", "device": str(device),
                      "threads": torch.get_num_threads(), "density": args.density,
                      "temperature": temperature, "iters": args.iters, "results": results}))


if __name__ == "__main__":
    main()
