"""The offline batch runner behind ``grammarserve batch``: an input file through an in-process
:class:`Engine` at full batch, results appended (and fsynced) as each line finishes, resumable.

Lines run in prompt order (lines sharing a prompt prefix back to back, so the radix cache
prefills it once) and enter the engine as room frees: at most ``max_in_flight`` engine requests
are queued or running, enough to keep every batch row busy without loading the whole file.
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grammarserve.batch.lines import (
    InputLine,
    InputReader,
    error_line,
    failure_line,
    response_line,
)
from grammarserve.batch.results import ResultFile, pending
from grammarserve.engine.engine import Engine
from grammarserve.engine.request import RequestOutput
from grammarserve.openai.bodies import final_usage
from grammarserve.openai.context import ModelContext
from grammarserve.openai.endpoints import prepare_body, reply_body
from grammarserve.openai.prepare import Prepared


@dataclass
class BatchSummary:
    """What one run did (``skipped``: lines already done by an earlier run)."""

    total_lines: int = 0
    skipped: int = 0
    completed: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    elapsed_s: float = 0.0
    interrupted: bool = False

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        lines = self.completed + self.failed
        return {"total_lines": self.total_lines, "skipped": self.skipped,
                "completed": self.completed, "failed": self.failed,
                "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "completion_tokens": self.completion_tokens,
                "elapsed_s": round(self.elapsed_s, 3),
                "lines_per_s": round(lines / self.elapsed_s, 3) if self.elapsed_s else 0.0,
                "tokens_per_s": round(self.completion_tokens / self.elapsed_s, 3)
                if self.elapsed_s else 0.0,
                "prefix_cache_hit_rate": round(self.cache_hit_rate, 4),
                "interrupted": self.interrupted}

    def report(self, who: str, output: Path, errors: Path, summary: Path | None) -> int:
        """End a CLI run: write :meth:`as_dict` to ``summary`` (if given), print one line on
        stderr, return the exit code (130 when interrupted)."""
        d = self.as_dict()
        if summary is not None:
            summary.write_text(json.dumps(d) + "\n")
        state = "interrupted (re-run the same command to resume)" if self.interrupted else "done"
        print(f"{who}: {state}: {self.completed} completed, {self.failed} failed, "
              f"{self.skipped} already done, of {self.total_lines} lines in "
              f"{self.elapsed_s:.1f}s ({d['lines_per_s']} lines/s, {d['tokens_per_s']} tok/s, "
              f"prefix-cache hit rate {d['prefix_cache_hit_rate']}); output {output}, "
              f"errors {errors}", file=sys.stderr)
        return 130 if self.interrupted else 0


@dataclass
class _Job:
    line: InputLine
    prep: Prepared
    ids: list[str] = field(default_factory=list)
    outs: dict[str, RequestOutput] = field(default_factory=dict)


class BatchRunner:
    """Runs batch files through one in-process engine; lines are prepared and answered by the
    protocol layer (:mod:`grammarserve.openai`) with ``ctx``, as the server answers them."""

    def __init__(self, engine: Engine, ctx: ModelContext, *,
                 max_in_flight: int | None = None) -> None:
        self.engine = engine
        self.ctx = ctx
        self.max_in_flight = max_in_flight or 2 * engine.config.max_num_reqs

    def run(self, input_path: Path, output_path: Path, error_path: Path, *,
            progress: Callable[[int, BatchSummary], None] | None = None,
            on_start: Callable[[int], None] | None = None) -> BatchSummary:
        """Run every line of ``input_path`` not yet in the output/error files.

        ``on_start(todo)`` is called once the work is known; ``progress(lines, summary)`` after
        each batch of finished lines. A ``KeyboardInterrupt`` ends the run with
        ``summary.interrupted`` (everything written so far stays written).
        """
        summary = BatchSummary()
        t0 = time.perf_counter()
        work = pending(input_path, output_path, error_path)
        todo, bad = work.todo, work.bad
        summary.total_lines, summary.skipped = work.total, work.skipped
        if on_start is not None:
            on_start(len(todo) + len(bad))
        with ResultFile(output_path) as out, ResultFile(error_path) as err, \
                InputReader(input_path) as reader:
            err.write([error_line(e) for e in bad])
            summary.failed += len(bad)
            if bad and progress is not None:
                progress(len(bad), summary)
            try:
                self._loop(deque(todo), reader, out, err, summary, progress)
            except KeyboardInterrupt:
                summary.interrupted = True
            finally:
                self._drain(summary.interrupted)
        summary.elapsed_s = time.perf_counter() - t0
        return summary

    def _drain(self, interrupted: bool) -> None:
        """Abort what is left in the engine (best effort after an interrupt, which may have
        landed inside a step)."""
        try:
            for rid in list(self.engine.requests):
                self.engine.abort(rid)
            while self.engine.has_unfinished():  # collect the aborts
                self.engine.step()
        except Exception:
            if not interrupted:
                raise

    def _loop(self, todo: deque[InputLine], reader: InputReader, out: ResultFile,
              err: ResultFile, summary: BatchSummary,
              progress: Callable[[int, BatchSummary], None] | None) -> None:
        engine = self.engine
        jobs: dict[str, _Job] = {}  # engine request id -> job
        queued = 0  # engine requests of running jobs
        serial = 0
        while todo or jobs:
            failures: list[dict[str, Any]] = []
            while todo and queued < self.max_in_flight:  # keep the engine fed
                line = todo.popleft()
                job = None
                try:
                    prep = prepare_body(self.ctx, line.url, reader.body(line))
                    prep.check_constraint()
                    job = _Job(line, prep)
                    for prompt, params in zip(prep.prompts, prep.params):
                        rid = f"b{serial}"
                        serial += 1
                        engine.add_request(rid, prompt, params, namespace=prep.namespace)
                        job.ids.append(rid)
                        jobs[rid] = job
                except Exception as e:  # noqa: BLE001 - the line fails, the job goes on
                    for rid in job.ids if job is not None else ():
                        engine.abort(rid)
                        del jobs[rid]
                    failures.append(failure_line(line.custom_id, e, line.line))
                    continue
                queued += len(prep.prompts)
            err.write(failures)
            summary.failed += len(failures)
            written = len(failures)
            if engine.has_unfinished():
                finished, lines = self._step(jobs, out, err, summary)
                queued -= finished
                written += lines
            if progress is not None and written:
                progress(written, summary)

    def _step(self, jobs: dict[str, _Job], out: ResultFile, err: ResultFile,
              summary: BatchSummary) -> tuple[int, int]:
        """One engine step; writes the lines it finished. Returns (engine requests finished,
        lines written)."""
        results: list[dict[str, Any]] = []
        failures: list[dict[str, Any]] = []
        finished = 0
        for o in self.engine.step():
            job = jobs.get(o.request_id)
            if job is None or not o.finished:
                continue
            finished += 1
            job.outs[o.request_id] = o
            if len(job.outs) < len(job.ids):
                continue
            outs = [job.outs[rid] for rid in job.ids]
            for rid in job.ids:
                del jobs[rid]
            try:
                body = reply_body(self.ctx, job.prep, outs)
            except Exception as e:  # noqa: BLE001 - the line fails, the job goes on
                failures.append(failure_line(job.line.custom_id, e, job.line.line))
                continue
            results.append(response_line(job.line.custom_id, 200, body))
            usage = final_usage(outs, num_prompts=len(outs) // job.prep.n)
            summary.prompt_tokens += usage["prompt_tokens"]
            summary.cached_tokens += usage["prompt_tokens_details"]["cached_tokens"]
            summary.completion_tokens += usage["completion_tokens"]
        out.write(results)
        err.write(failures)
        summary.completed += len(results)
        summary.failed += len(failures)
        return finished, len(results) + len(failures)

