"""Greedy decode throughput: grammarserve's engine vs transformers ``generate``, same model/machine.

For each batch size B: prompts of ``--prompt-len`` random tokens, ``--new-tokens`` greedy tokens
(EOS ignored). Each side is timed twice: with 1 new token (prefill) and with all of them; decode
tokens/s = B * (new_tokens - 1) / (t_all - t_prefill). End-to-end tokens/s = B * new_tokens / t_all.
The prefix cache is off: the second run of the same prompts must not reuse the first run's KV
(transformers has no such cache).

That difference is well posed for transformers (one batched prefill, then B rows decoding), not
for grammarserve at large B: its prefill is chunked (``max_batch_tokens``), so the first rows
decode inside the later rows' prefill steps, almost for free, and ``t_all - t_prefill`` measures
a marginal cost, down to noise at 64 rows. So grammarserve also reports ``steady_decode_tok_s``:
a third run, timed from the step where the last row got its first token to the step where the
first row finished, i.e. every one of the B rows decoding in every step; and the top-level
``steady_ratios`` compare each B with the smallest B of the run. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch
from machine import stamp


def _grammarserve(prompts: list[list[int]], new_tokens: int, llm: Any) -> float:
    from grammarserve import SamplingParams

    t0 = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(max_tokens=new_tokens, temperature=0,
                                                ignore_eos=True))
    dt = time.perf_counter() - t0
    assert all(len(o.token_ids) == new_tokens for o in outs)
    return dt


def _grammarserve_steady(prompts: list[list[int]], new_tokens: int, llm: Any) -> dict[str, Any]:
    """Tokens/s while all ``len(prompts)`` rows decode (see the module docstring)."""
    from grammarserve import SamplingParams

    eng = llm.engine
    reqs = []
    for i, ids in enumerate(prompts):
        rid = f"steady-{time.monotonic_ns()}-{i}"
        eng.add_request(rid, ids, SamplingParams(max_tokens=new_tokens, temperature=0,
                                                 ignore_eos=True))
        reqs.append(eng.requests[rid])

    def generated() -> int:
        return sum(len(r.output_ids) for r in reqs)

    while any(not r.output_ids for r in reqs):
        eng.step()
    t0, n0, steps = time.perf_counter(), generated(), 0
    while not any(r.finished for r in reqs):
        eng.step()
        steps += 1
    dt, n = time.perf_counter() - t0, generated() - n0
    while eng.has_unfinished():
        eng.step()
    assert all(len(r.output_ids) == new_tokens for r in reqs)
    return {"steady_decode_tok_s": round(n / max(dt, 1e-9), 2), "steady_steps": steps,
            "steady_tokens": n}


def _transformers(prompts: list[list[int]], new_tokens: int, model: Any) -> float:
    ids = torch.tensor(prompts)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    dt = time.perf_counter() - t0
    assert out.shape[1] == ids.shape[1] + new_tokens
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--baseline", default=True, action=argparse.BooleanOptionalAction,
                    help="also time transformers generate (--no-baseline: grammarserve only)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    from grammarserve import LLM
    from grammarserve.models.loader import default_model_path

    batches = [int(b) for b in args.batches.split(",")]
    max_b = max(batches)
    llm = LLM("default", device="cpu", max_num_reqs=max_b,
              kv_cache_tokens=max_b * (args.prompt_len + args.new_tokens) + 64,
              # the decode mirror sized for the largest batch (a server's default pool is larger
              # and its mirror, half of it, holds such a batch; this pool is sized to the need)
              decode_mirror_tokens=max_b * (args.prompt_len + args.new_tokens + 64),
              max_batch_tokens=2048, enable_prefix_cache=False)  # both runs re-prefill
    path = default_model_path()
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                              dtype=torch.float32).eval() if args.baseline else None
    gen = torch.Generator().manual_seed(0)
    vocab = llm.engine.loaded.config.vocab_size
    results: dict[str, Any] = {"bench": "decode", "model": "SmolLM2-135M-Instruct (GGUF Q4_1 "
                               "dequantized, fp32)", "prompt_len": args.prompt_len,
                               "new_tokens": args.new_tokens, "threads": args.threads,
                               "runs": []}
    # Warm-up at the prompt length: the first prefill of a shape pays one-time costs (BLAS
    # kernel selection, thread pools) that would otherwise count as prefill time.
    warm = torch.randint(100, vocab, (1, args.prompt_len), generator=gen).tolist()
    _grammarserve(warm, 2, llm)
    if hf is not None:
        _transformers(warm, 2, hf)
    for b in batches:
        prompts = torch.randint(100, vocab, (b, args.prompt_len), generator=gen).tolist()
        row: dict[str, Any] = {"batch": b}
        sides: list[tuple[str, Any, Any]] = [("grammarserve", _grammarserve, llm)]
        if hf is not None:
            sides.append(("transformers", _transformers, hf))
        for name, fn, obj in sides:
            t1 = fn(prompts, 1, obj)
            tn = fn(prompts, args.new_tokens, obj)
            row[name] = {
                "prefill_s": round(t1, 3),
                "total_s": round(tn, 3),
                "decode_tok_s": round(b * (args.new_tokens - 1) / max(tn - t1, 1e-9), 2),
                "e2e_tok_s": round(b * args.new_tokens / tn, 2),
            }
            if name == "grammarserve":
                row[name].update(_grammarserve_steady(prompts, args.new_tokens, llm))
        if hf is not None:
            row["decode_ratio"] = round(row["grammarserve"]["decode_tok_s"]
                                        / row["transformers"]["decode_tok_s"], 2)
            row["e2e_ratio"] = round(row["grammarserve"]["e2e_tok_s"]
                                     / row["transformers"]["e2e_tok_s"], 2)
        results["runs"].append(row)
    base = results["runs"][0]
    results["steady_ratios"] = {
        f"{r['batch']}_vs_{base['batch']}": round(
            r["grammarserve"]["steady_decode_tok_s"]
            / max(base["grammarserve"]["steady_decode_tok_s"], 1e-9), 2)
        for r in results["runs"][1:]}
    print(json.dumps({**stamp(), **results}))


if __name__ == "__main__":
    main()
