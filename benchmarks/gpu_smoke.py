"""Five-minute GPU smoke test: prints ONE JSON line (and writes it to --out).

Sections (each in its own try; a failure is recorded and the others still run, within an overall
time budget): ``kernel_tests`` (the Triton kernel tests, compiled on CUDA), ``parity`` (greedy
tokens of the embedded model's shape, CUDA fp32 vs CPU fp32 and bf16, random weights: see
random_models.py), ``engine_paths`` (a shared-prefix pair and a JSON-schema request with long
forced spans through the engine), ``sync_debug`` (one engine step under
``torch.cuda.set_sync_debug_mode("warn")``, the remaining syncs by file:line),
``engine_process`` (one EngineProcess round trip), ``engine_decode`` (Engine.step() at
batch 32 on the SmolLM2 shape, graphs on and off), ``decode`` (ms/step and peak memory at batch
1, 32 and 128 on random Llama-3.2-1B and Llama-3.1-8B shapes in bf16) and ``attention``
(the varlen flash path against the torch SDPA path, one layer of the 8B shape).

Each section is judged pass / fail / skip with its reason (benchmarks/smoke_verdict.py: the
tolerances against the CPU fp32 reference and the rules); the JSON line carries them under
``verdicts`` and the run's result under ``overall``, and stderr lists them. Exit status: 0 when
every section passed; 1 when any failed; 3 when none failed but some were skipped, which is what a
run without CUDA always is ("skipped: no CUDA": ``--device cpu``, or ``--device cuda`` where torch
sees no CUDA device, in which case no section runs). ``--allow-skip`` makes a skip exit 0 (the
label still says "skipped"); 2 is a usage error.

    python benchmarks/gpu_smoke.py --device cuda --out $OUT/gpu_smoke.json
    python benchmarks/gpu_smoke.py --device cpu --small --allow-skip  # dry run of every path
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
# NOTE: the root last (an uninstalled tree), so an installed `kernels` package comes before the
# root's kernels/ folder (grammarserve/source_paths.py)
sys.path.append(str(ROOT))

import torch
from machine import stamp
from random_models import (
    decode_bench,
    llama_config,
    random_model_on,
    write_random_folder,
)
from smoke_engine import (
    attention_bench,
    engine_decode,
    engine_paths,
    engine_process_round_trip,
    greedy_parity,
    sync_listing,
)
from smoke_verdict import judge, overall

from grammarserve.models.config import ModelConfig

FLASHINFER = ("not attempted: the flashinfer-python 0.7.2 wheel alone is 62 MB and needs "
              "apache-tvm-ffi, nvidia-cutlass-dsl and cuda-tile besides, over the 64 MiB that "
              "travels to the device machine; attention uses torch's FlashAttention-2 varlen "
              "kernel instead (grammarserve/attention/varlen.py)")


def log(msg: str) -> None:
    print(f"[smoke {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Smoke:
    """Runs sections under one time budget, recording each one's result or error."""

    def __init__(self, budget_s: float) -> None:
        self.t0 = time.monotonic()
        self.budget_s = budget_s
        self.result: dict[str, Any] = {}

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def run(self, name: str, need_s: float, fn: Any, *args: Any) -> Any:
        if self.left() < need_s:
            self.result[name] = {"skipped": f"{self.left():.0f}s left, needs ~{need_s:.0f}s"}
            log(f"{name}: skipped")
            return None
        log(f"{name}: start ({self.left():.0f}s left)")
        t = time.monotonic()
        try:
            out = fn(*args)
            self.result[name] = out
            return out
        except Exception as e:  # noqa: BLE001 - a section's failure is data, not the end
            self.result[name] = {"error": f"{type(e).__name__}: {e}"[:500],
                                 "where": traceback.format_exc().splitlines()[-6:]}
            log(f"{name}: ERROR {type(e).__name__}: {e}")
            return None
        finally:
            if isinstance(self.result.get(name), dict):
                self.result[name]["seconds"] = round(time.monotonic() - t, 1)
            log(f"{name}: done in {time.monotonic() - t:.1f}s")


def env_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "python": sys.version.split()[0]}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(gpu=p.name, sm=f"{p.major}.{p.minor}", gpu_mem_gib=round(p.total_memory /
                                                                             2**30, 1),
                    cuda=torch.version.cuda)
    return info


def kernel_tests(device: torch.device, timeout_s: float) -> dict[str, Any]:
    """The Triton kernel tests (sampler, KV index, paged decode) in a child process: compiled
    on CUDA (TRITON_INTERPRET unset), interpreted on a CPU dry run."""
    env = dict(os.environ)
    if device.type == "cuda":
        env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "tests/test_kernels_triton.py", "tests/test_kernels_kv_indices.py",
           "tests/test_kernels_paged_decode.py"]
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout_s)
    tail = (proc.stdout + proc.stderr).strip().splitlines()
    summary = next((line for line in reversed(tail) if " passed" in line or " failed" in line
                    or " error" in line), tail[-1] if tail else "")
    return {"returncode": proc.returncode, "summary": summary,
            "compiled": device.type == "cuda", "tail": tail[-8:] if proc.returncode else []}


def decode_section(device: torch.device, small: bool, batches: list[int],
                   smoke: Smoke) -> dict[str, Any]:
    out: dict[str, Any] = {}
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shapes = ["tiny"] if small else ["llama-3.1-8b", "llama-3.2-1b"]
    for shape in shapes:
        cfg = ModelConfig.from_hf_dict(llama_config(shape))
        model = random_model_on(cfg, dtype, device)
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        rows = []
        for b in batches:
            if smoke.left() < 20:
                rows.append({"batch": b, "skipped": "time budget"})
                continue
            for graphs in (True, False):  # (on CPU the graph path runs eagerly)
                log(f"decode {shape} batch {b} graphs {graphs}")
                try:
                    rows.append(decode_bench(model, device, b, steps=4 if small else 16,
                                             graphs=graphs))
                except Exception as e:  # noqa: BLE001 - recorded; the other rows still run
                    rows.append({"batch": b, "graphs": graphs, "error": f"{type(e).__name__}: "
                                                                         f"{e}"[:300]})
        out[shape] = {"weights_gib": round(weight_bytes / 2**30, 2), "steps": rows}
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


#: The sections in the order they run (kernel_tests last: it may use what is left of the budget).
SECTIONS = ("parity", "engine_paths", "sync_debug", "engine_process", "engine_decode", "decode",
            "attention", "kernel_tests")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="tiny shapes (CPU dry run)")
    ap.add_argument("--budget-s", type=float, default=290.0)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--work", type=Path, default=Path("/tmp/gs_smoke"))
    ap.add_argument("--tokenizer-dir", type=Path, default=ROOT / ".smoke" / "smollm2",
                    help="folder with the embedded model's config.json and tokenizer files")
    ap.add_argument("--skip", default="", help="comma-separated sections to leave out")
    ap.add_argument("--allow-skip", action="store_true",
                    help="exit 0 when no section failed but some were skipped (no CUDA)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda" and torch.cuda.is_available()
    skip = set(filter(None, args.skip.split(",")))
    smoke = Smoke(args.budget_s)
    r = smoke.result
    r.update(stamp())
    r["date"] = time.strftime("%Y-%m-%d")
    r["env"] = env_info(device if cuda else torch.device("cpu"))
    r["flashinfer"] = FLASHINFER
    if device.type == "cuda" and not cuda:
        for name in SECTIONS:  # nothing to run them on
            r[name] = {"skipped": "no CUDA: torch.cuda.is_available() is False"}
    else:
        _run_sections(smoke, args, device, skip)
    verdicts = {name: judge(name, r.get(name), cuda) for name in SECTIONS}
    label, status = overall(verdicts, cuda, args.allow_skip)
    r["verdicts"] = {name: v.as_json() for name, v in verdicts.items()}
    r["overall"] = label
    r["ok"] = label == "pass"
    r["seconds"] = round(time.monotonic() - smoke.t0, 1)
    line = json.dumps(r, separators=(",", ":"), default=str)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(line + "\n")
    print(line, flush=True)
    for name, v in verdicts.items():
        log(f"{name}: {v.status.value}: {v.reason}")
    log(f"overall: {label} (exit {status})")
    return status


def _run_sections(smoke: Smoke, args: argparse.Namespace, device: torch.device,
                  skip: set[str]) -> None:
    r = smoke.result
    small = args.small
    cfg_json = json.loads((args.tokenizer_dir / "config.json").read_text())
    if small:  # the tokenizer's vocabulary, a tiny decoder
        cfg_json.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    folder = write_random_folder(args.work / "smollm2-random", cfg_json, args.tokenizer_dir)
    r["model"] = {"config": "SmolLM2-135M (GGUF metadata)" if not small else "tiny",
                  "weights": "random (seeded, scaled for logit margins)"}
    plan: list[tuple[Any, ...]] = [
        ("parity", 40, greedy_parity, folder, device, small),
        ("engine_paths", 30, engine_paths, folder, device),
        ("sync_debug", 20, sync_listing, folder, device),
        ("engine_process", 40, engine_process_round_trip, folder, device),
        ("engine_decode", 20, engine_decode, folder, device),
        ("decode", 60, decode_section, device, small, [32, 1, 128] if not small else [1, 4],
         smoke),
        ("attention", 20, attention_bench, device, small),
        ("kernel_tests", 30, kernel_tests, device, None)]
    assert tuple(name for name, *_ in plan) == SECTIONS
    for name, need, fn, *fargs in plan:
        if name == "kernel_tests":  # last: it may use what is left of the budget
            fargs = [device, max(20.0, smoke.left() - 10)]
        if name in skip:
            r[name] = {"skipped": "left out by --skip"}
        else:
            smoke.run(name, need, fn, *fargs)


if __name__ == "__main__":
    raise SystemExit(main())
