"""Data-extraction batch job: ``grammarserve batch`` vs a naive transformers + xgrammar loop.

N extraction lines (benchmarks/extraction_workload.py: a shared few-shot instruction prompt, one
document per line, the 7-field contact schema as ``response_format``, greedy) are written as an
OpenAI batch input file and run through the CLI (``python -m grammarserve.cli batch``, a separate
process; its run time excludes model loading). The baseline runs the same lines with
``transformers`` ``generate`` and xgrammar's logits processor (``xgrammar.contrib.hf``), one
request at a time, on the first ``--baseline-lines`` lines (it is slow) and is extrapolated per
line. Prints one JSON line: for both sides the success figures of ``figures.py`` first, over all
lines (``success_pct``: valid replies not cut by ``max_tokens``; ``goodput_valid_per_s``: valid
replies per second of run time; ``valid_of_finished_pct``; ``cut_by_length``), then lines/s,
output tokens/s, prefix-cache hit rate, the older ``valid_pct`` and field accuracy, and the
lines/s and goodput ratios.

``--few-shot-style spaced|compact|indented|none`` picks how the prompt's worked examples are
written (``extraction_workload.py``); ``--dump-replies PATH`` writes every reply as JSONL.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parent))
import extraction_workload as wl
from figures import success_figures
from machine import stamp
from serverproc import GRAMMARSERVE

ROOT = Path(__file__).resolve().parent.parent


def write_input(path: Path, n: int, shots: int, max_tokens: int, style: str = "spaced"
                ) -> list[dict[str, Any]]:
    """The batch input file; returns the expected records (line order)."""
    expected = []
    with open(path, "w") as f:
        for i, (doc, rec) in enumerate(wl.documents(n)):
            body = {"model": "default", "messages": wl.messages(doc, shots, style),
                    "max_tokens": max_tokens, "temperature": 0,
                    "response_format": {"type": "json_schema", "json_schema": {
                        "name": "contact", "strict": True, "schema": wl.SCHEMA}}}
            f.write(json.dumps({"custom_id": f"doc-{i}", "method": "POST",
                                "url": "/v1/chat/completions", "body": body}) + "\n")
            expected.append(rec)
    return expected


def judge(text: str | None, finish: str | None) -> bool:
    """A success: a reply that came back, was not cut by ``max_tokens`` and validates."""
    if text is None or finish == "length":
        return False
    try:
        jsonschema.validate(json.loads(text), wl.SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def score(texts: list[str | None], finishes: list[str | None],
          expected: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """``texts[i]`` None: line ``i`` failed (no reply). ``wall_s``: the run time for goodput."""
    valid = correct = 0
    for text, exp in zip(texts, expected):
        try:
            obj = json.loads(text or "")
            jsonschema.validate(obj, wl.SCHEMA)
        except (ValueError, jsonschema.ValidationError):
            continue
        valid += 1
        correct += sum(obj.get(k) == v for k, v in exp.items())
    n = max(1, len(texts))
    cut = sum(f == "length" for f in finishes)
    finished = sum(t is not None and f != "length" for t, f in zip(texts, finishes))
    good = sum(judge(t, f) for t, f in zip(texts, finishes))
    return {**success_figures(len(texts), good, finished, cut, wall_s),
            "valid_pct": round(100 * valid / n, 1),
            "field_accuracy_pct": round(100 * correct / (len(wl.SCHEMA["required"]) * n), 1)}


def write_replies(path: Path, side: str, texts: list[str | None],
                  finishes: list[str | None]) -> None:
    with open(path, "a") as f:
        f.writelines(json.dumps({"side": side, "i": i, "finish_reason": fin,
                                 "valid": judge(t, fin), "text": t}) + "\n"
                     for i, (t, fin) in enumerate(zip(texts, finishes)))


def run_cli(inp: Path, expected: list[dict[str, Any]], args: argparse.Namespace
            ) -> dict[str, Any]:
    out, summary = inp.with_name("out.jsonl"), inp.with_name("summary.json")
    cmd = [GRAMMARSERVE, "batch", str(inp), "-o", str(out),
           "--summary", str(summary), "--no-progress", "--kv-cache-tokens",
           str(args.kv_cache_tokens), "--max-num-reqs", str(args.max_num_reqs),
           "--max-batch-tokens", str(args.max_batch_tokens), "--num-threads", str(args.threads)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    s = json.loads(summary.read_text())
    texts: dict[str, str] = {}
    finishes: dict[str, str] = {}
    for line in out.read_text().splitlines():
        rec = json.loads(line)
        if rec["response"] and rec["response"]["status_code"] == 200:
            choice = rec["response"]["body"]["choices"][0]
            texts[rec["custom_id"]] = choice["message"]["content"]
            finishes[rec["custom_id"]] = choice.get("finish_reason")
    ordered = [texts.get(f"doc-{i}") for i in range(len(expected))]
    fins = [finishes.get(f"doc-{i}") for i in range(len(expected))]
    if args.dump_replies:
        write_replies(args.dump_replies, "grammarserve_cli", ordered, fins)
    return {"lines": len(expected), **score(ordered, fins, expected, s["elapsed_s"]),
            "completed": s["completed"], "failed": s["failed"],
            "run_s": s["elapsed_s"], "wall_s_with_load": round(wall, 1),
            "lines_per_s": s["lines_per_s"], "output_tokens": s["completion_tokens"],
            "tokens_per_s": s["tokens_per_s"], "prompt_tokens": s["prompt_tokens"],
            "prefix_cache_hit_rate": s["prefix_cache_hit_rate"]}


def run_baseline(inp: Path, expected: list[dict[str, Any]], k: int, threads: int,
                 dump: Path | None = None) -> dict[str, Any]:
    """transformers + xgrammar's HF logits processor, one request at a time."""
    import torch
    import xgrammar as xgr
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from xgrammar.contrib.hf import LogitsProcessor

    from grammarserve.models.loader import default_model_path

    torch.set_num_threads(threads)
    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=model.config.vocab_size)
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(wl.SCHEMA))
    lines = [json.loads(x) for x in inp.read_text().splitlines()[:k]]
    texts: list[str | None] = []
    finishes: list[str | None] = []
    n_out = 0
    t0 = time.perf_counter()
    for line in lines:
        body = line["body"]
        enc: Any = tok.apply_chat_template(body["messages"], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
        ids = enc["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=body["max_tokens"], do_sample=False,
                                 logits_processor=[LogitsProcessor(compiled)],
                                 pad_token_id=tok.eos_token_id)
        new = out[0, ids.shape[1]:]
        n_out += len(new)
        texts.append(str(tok.decode(new, skip_special_tokens=True)))
        stopped = len(new) > 0 and int(new[-1]) == tok.eos_token_id
        finishes.append("stop" if stopped or len(new) < body["max_tokens"] else "length")
    dt = time.perf_counter() - t0
    if dump is not None:
        write_replies(dump, "baseline_transformers_xgrammar", texts, finishes)
    return {"lines": k, **score(texts, finishes, expected[:k], dt),
            "run_s": round(dt, 2), "lines_per_s": round(k / dt, 4),
            "output_tokens": n_out, "tokens_per_s": round(n_out / dt, 2),
            "extrapolated_run_s_all_lines": round(dt / k * len(expected), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=500)
    ap.add_argument("--baseline-lines", type=int, default=8,
                    help="lines the naive baseline runs (extrapolated per line); 0 = skip")
    ap.add_argument("--shots", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-cache-tokens", type=int, default=65536)
    ap.add_argument("--max-num-reqs", type=int, default=64)
    ap.add_argument("--max-batch-tokens", type=int, default=2048)
    ap.add_argument("--few-shot-style", choices=wl.FEW_SHOT_STYLES, default="spaced",
                    help="the few-shot answers as json.dumps defaults (spaced), compact, "
                         "indent=2, or no examples")
    ap.add_argument("--dump-replies", metavar="PATH", type=Path, default=None,
                    help="write each reply (side, text, finish_reason, valid) as JSONL")
    args = ap.parse_args()
    if args.dump_replies:
        args.dump_replies.write_text("")
    with tempfile.TemporaryDirectory() as tmp:
        inp = Path(tmp) / "in.jsonl"
        expected = write_input(inp, args.lines, args.shots, args.max_tokens, args.few_shot_style)
        result: dict[str, Any] = {"bench": "batch", "lines": args.lines, "shots": args.shots,
                                  "few_shot_style": args.few_shot_style,
                                  "max_tokens": args.max_tokens,
                                  "threads": args.threads, "cpu_count": os.cpu_count()}
        result["grammarserve_cli"] = run_cli(inp, expected, args)
        if args.baseline_lines:
            base = run_baseline(inp, expected, min(args.baseline_lines, args.lines),
                                args.threads, args.dump_replies)
            result["baseline_transformers_xgrammar"] = base
            result["lines_per_s_ratio"] = round(
                result["grammarserve_cli"]["lines_per_s"] / base["lines_per_s"], 2)
            result["tokens_per_s_ratio"] = round(
                result["grammarserve_cli"]["tokens_per_s"] / base["tokens_per_s"], 2)
            ours = result["grammarserve_cli"]["goodput_valid_per_s"]
            theirs = base["goodput_valid_per_s"]
            result["goodput_ratio"] = round(ours / theirs, 2) if ours and theirs else None
    print(json.dumps({**stamp(), **result}))


if __name__ == "__main__":
    main()
