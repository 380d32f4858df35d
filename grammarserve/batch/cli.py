"""``grammarserve batch IN.jsonl -o OUT.jsonl [--errors ERR.jsonl]``: an OpenAI batch input file
through the in-process engine, with a progress bar; re-running the same command resumes."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from grammarserve.config import EngineConfig


def add_parser(sub: Any, engine_args: Callable[[argparse.ArgumentParser], None]
               ) -> argparse.ArgumentParser:
    """Register the ``batch`` subcommand (``sub``: the CLI's subparsers); returns its parser."""
    p = sub.add_parser("batch", help="run an OpenAI batch file (JSONL) offline, resumable",
                       description=__doc__)
    p.add_argument("input", type=Path, help="input JSONL: {custom_id, method, url, body} lines")
    p.add_argument("-o", "--output", type=Path, required=True,
                   help="output JSONL (appended; lines already there are skipped)")
    p.add_argument("--errors", type=Path, default=None,
                   help="error JSONL (bad lines and failed requests, with line numbers; "
                        "default: OUTPUT with the suffix .errors.jsonl)")
    p.add_argument("--max-n", type=int, default=16, help="largest n (choices per line)")
    p.add_argument("--max-in-flight", type=int, default=None,
                   help="engine requests queued or running at once (default 2 x max-num-reqs)")
    p.add_argument("--summary", type=Path, default=None, help="write the run's summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    engine_args(p)
    return p


def default_errors_path(output: Path) -> Path:
    return output.with_name(output.name.removesuffix(".jsonl") + ".errors.jsonl")


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(args: argparse.Namespace, config: EngineConfig) -> int:
    """Run the ``batch`` subcommand; exit code 0, or 130 when interrupted (resumable)."""
    from tqdm import tqdm

    from grammarserve.batch.runner import BatchRunner, BatchSummary
    from grammarserve.engine.engine import Engine
    from grammarserve.engine.heap import freeze_startup_heap
    from grammarserve.errors import InvalidRequestError
    from grammarserve.openai.context import ModelContext, model_name

    if not args.input.is_file():
        raise InvalidRequestError(f"input file {args.input} does not exist", param="input")
    errors = args.errors or default_errors_path(args.output)
    signal.signal(signal.SIGTERM, _raise_interrupt)  # a plain kill ends like Ctrl-C
    t0 = time.perf_counter()
    engine = Engine(config)
    engine.warm_up()
    freeze_startup_heap()
    ctx = ModelContext.create(engine.tokenizer, engine.grammar.compiler,
                              max_model_len=engine.max_model_len, max_n=args.max_n,
                              model_name=model_name(config, str(engine.loaded.folder)),
                              tool_call_format=config.tool_call_format,
                              reasoning_parser=config.reasoning_parser,
                              strict_thinking=config.strict_thinking,
                              tool_call_parser=config.tool_call_parser,
                              vocab_size=engine.vocab_size)
    print(f"grammarserve batch: loaded {config.model} in {time.perf_counter() - t0:.1f}s",
          file=sys.stderr)
    bar: Any = None
    t_start = time.perf_counter()

    def on_start(todo: int) -> None:
        nonlocal bar, t_start
        t_start = time.perf_counter()
        bar = tqdm(total=todo, unit="line", dynamic_ncols=True, disable=args.no_progress,
                   file=sys.stderr, smoothing=0.1)

    def progress(lines: int, s: BatchSummary) -> None:
        dt = max(time.perf_counter() - t_start, 1e-9)
        bar.set_postfix(tok_s=f"{s.completion_tokens / dt:.1f}", failed=s.failed, refresh=False)
        bar.update(lines)

    runner = BatchRunner(engine, ctx, max_in_flight=args.max_in_flight)
    try:
        summary = runner.run(args.input, args.output, errors, progress=progress,
                             on_start=on_start)
    finally:
        if bar is not None:
            bar.close()
    return summary.report("grammarserve batch", args.output, errors, args.summary)
