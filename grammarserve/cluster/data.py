"""Batch jobs on Ray Data (``grammarserve batch IN -o OUT --ray``): OpenAI batch lines through an
actor pool of engines with ``map_batches``.

Each actor holds one in-process :class:`~grammarserve.engine.engine.Engine` and answers its share
of lines with the local runner (:class:`~grammarserve.batch.runner.BatchRunner`), so a line gets
the same result or error record as ``grammarserve batch`` gives it. Lines go to the actors in
prompt order (lines sharing a prompt prefix are adjacent, so one actor prefills a shared prompt
once); the driver appends each finished record to the output or error file (fsynced, as the
local runner does), so a re-run skips every ``custom_id`` already there.

Ray Data restarts an actor that dies and runs its lines again; their records reach the files only
once their task has finished, and the driver writes a ``custom_id`` at most once.

Python::

    import ray
    from grammarserve.cluster.data import RayBatchConfig, batch_dataset

    ds = ray.data.read_parquet("lines.parquet")  # custom_id, url, body (+ method)
    out = batch_dataset(ds, RayBatchConfig(replicas=2))
    out.filter(lambda r: not r["error"]).write_json("results/")  # rows: custom_id, line,
                                                                  # error, record (JSON text)
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
import ray.data

from grammarserve.batch.lines import InputReader, error_line, sort_key
from grammarserve.batch.results import ResultFile, pending, recover
from grammarserve.batch.runner import BatchRunner, BatchSummary
from grammarserve.config import EngineConfig
from grammarserve.errors import InvalidRequestError
from grammarserve.source_paths import drop_source_root

#: Columns of the rows the actors take and give.
IN_COLUMNS = ("custom_id", "line", "url", "body")
OUT_COLUMNS = ("custom_id", "line", "error", "record")


@dataclass(frozen=True)
class RayBatchConfig:
    """A batch job on Ray Data.

    Parameters
    ----------
    engine:
        Each actor's engine.
    replicas:
        Engine actors.
    replica_cpus:
        CPUs Ray reserves for each actor.
    lines_per_task:
        Lines one ``map_batches`` call answers (one engine run at full batch).
    max_n:
        Largest ``n`` a line may ask for.
    """

    engine: EngineConfig = field(default_factory=EngineConfig)
    replicas: int = 1
    replica_cpus: float = 1.0
    lines_per_task: int = 64
    max_n: int = 16

    def __post_init__(self) -> None:
        for name in ("replicas", "lines_per_task", "max_n"):
            if getattr(self, name) < 1:
                raise InvalidRequestError(f"{name} must be >= 1", param=name)


class BatchActor:
    """One engine answering batches of lines (the ``map_batches`` callable class)."""

    def __init__(self, config: EngineConfig, max_n: int) -> None:
        from grammarserve.engine.engine import Engine
        from grammarserve.engine.heap import freeze_startup_heap
        from grammarserve.openai.context import ModelContext, model_name

        drop_source_root(sys.path)  # before transformers loads the tokenizer
        self.engine = Engine(config)
        self.engine.warm_up()
        freeze_startup_heap()  # NOTE: the actor's process exists for this engine
        ctx = ModelContext.create(self.engine.tokenizer, self.engine.grammar.compiler,
                                  max_model_len=self.engine.max_model_len, max_n=max_n,
                                  model_name=model_name(config, str(self.engine.loaded.folder)),
                                  tool_call_format=config.tool_call_format,
                                  reasoning_parser=config.reasoning_parser,
                                  strict_thinking=config.strict_thinking,
                                  tool_call_parser=config.tool_call_parser,
                                  vocab_size=self.engine.vocab_size)
        self.runner = BatchRunner(self.engine, ctx)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        """Rows ``custom_id, line, url, body`` (body: JSON text) to rows ``custom_id, line,
        error, record`` (the output or error file's line as JSON text)."""
        rows = [(cid, line, url, _one_line(body))
                for cid, line, url, body in zip(*(batch[c] for c in IN_COLUMNS))]
        work = Path(tempfile.mkdtemp(prefix="grammarserve-ray-batch-"))
        try:
            src = work / "in.jsonl"
            src.write_text("".join(
                f'{{"custom_id":{json.dumps(str(cid))},"method":"POST",'
                f'"url":{json.dumps(str(url))},"body":{body}}}\n' for cid, _, url, body in rows),
                encoding="utf-8")
            self.runner.run(src, work / "out.jsonl", work / "err.jsonl")
            lines = [int(r[1]) for r in rows]  # the input's line numbers, by local line - 1
            out: dict[str, list[Any]] = {c: [] for c in OUT_COLUMNS}
            for path, is_error in ((work / "out.jsonl", False), (work / "err.jsonl", True)):
                for rec in recover(path):
                    _renumber(rec, lines)
                    out["custom_id"].append(rec.get("custom_id") or "")
                    out["line"].append(rec.get("line", 0))
                    out["error"].append(is_error)
                    out["record"].append(json.dumps(rec, ensure_ascii=False,
                                                    separators=(",", ":")))
            return out
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _one_line(body: Any) -> str:
    """A body as one line of JSON (text that is not JSON becomes a JSON string, which the
    runner refuses as a body that is not an object)."""
    try:
        return json.dumps(json.loads(str(body)), ensure_ascii=False, separators=(",", ":"))
    except ValueError:
        return json.dumps(str(body))


def _renumber(record: dict[str, Any], lines: list[int]) -> None:
    """Give a record of the actor's local file the input's line number."""
    for holder in (record, record.get("error")):
        if isinstance(holder, dict) and isinstance(holder.get("line"), int):
            holder["line"] = lines[holder["line"] - 1]


def _as_row(row: dict[str, Any]) -> dict[str, Any]:
    """A user's line (``custom_id``, ``url``, ``body`` as a dict or JSON text, optional
    ``line``) as an actor's input row, with its prompt-order key."""
    body = row.get("body")
    text = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    url = str(row.get("url") or "")
    key = "\x00".join(sort_key(url, parsed)) if isinstance(parsed, dict) else ""
    return {"custom_id": str(row.get("custom_id") or ""), "line": int(row.get("line") or 0),
            "url": url, "body": text, "key": key}


def batch_dataset(ds: ray.data.Dataset, config: RayBatchConfig, *,
                  ordered: bool = False) -> ray.data.Dataset:
    """Answer a dataset of OpenAI batch lines (columns ``custom_id``, ``url``, ``body``; ``body``
    a dict or JSON text; ``line`` optional, echoed in error records). ``custom_id`` must be
    unique. Rows are sorted by prompt unless ``ordered`` (already in prompt order).

    Returns rows ``custom_id``, ``line``, ``error`` (True: an error-file record) and ``record``
    (the output or error file's line, JSON text), as the lines finish.
    """
    if not ordered:
        ds = ds.map(_as_row).sort("key")
    return ds.map_batches(
        BatchActor, fn_constructor_args=(config.engine, config.max_n),
        batch_size=config.lines_per_task,
        compute=ray.data.ActorPoolStrategy(size=config.replicas),
        num_cpus=config.replica_cpus, batch_format="numpy")


def run_file(input_path: Path, output_path: Path, error_path: Path, config: RayBatchConfig,
             *, progress: Callable[[int, BatchSummary], None] | None = None,
             on_start: Callable[[int], None] | None = None) -> BatchSummary:
    """Run every line of ``input_path`` not yet in the output/error files on the actor pool
    (``ray.init`` first); the files are those of ``grammarserve batch``."""
    summary = BatchSummary()
    t0 = time.perf_counter()
    work = pending(input_path, output_path, error_path)
    todo, bad = work.todo, work.bad  # todo in prompt order
    summary.total_lines, summary.skipped = work.total, work.skipped
    if on_start is not None:
        on_start(len(todo) + len(bad))
    with ResultFile(output_path) as out, ResultFile(error_path) as err:
        err.write([error_line(e) for e in bad])
        summary.failed += len(bad)
        if todo:
            with InputReader(input_path) as reader:
                rows = [{"custom_id": x.custom_id, "line": x.line, "url": x.url,
                         "body": json.dumps(reader.body(x), ensure_ascii=False)} for x in todo]
            ds = batch_dataset(ray.data.from_items(rows), config, ordered=True)
            try:
                _collect(ds.iter_batches(batch_size=None, batch_format="numpy"), out, err,
                         summary, progress, set(work.done.custom_ids))
            except KeyboardInterrupt:
                summary.interrupted = True
    summary.elapsed_s = time.perf_counter() - t0
    return summary


def _collect(batches: Iterable[dict[str, Any]], out: ResultFile, err: ResultFile,
             summary: BatchSummary, progress: Callable[[int, BatchSummary], None] | None,
             written: set[str]) -> None:
    """Append each finished record once (by ``custom_id``) and count it."""
    for batch in batches:
        results: list[dict[str, Any]] = []
        failures: list[dict[str, Any]] = []
        for cid, is_error, text in zip(batch["custom_id"], batch["error"], batch["record"]):
            if cid and cid in written:
                continue  # a retried task's record, already written
            written.add(str(cid))
            rec = json.loads(text)
            (failures if is_error else results).append(rec)
            _count(rec, summary, bool(is_error))
        out.write(results)
        err.write(failures)
        if progress is not None and (results or failures):
            progress(len(results) + len(failures), summary)


def _count(record: dict[str, Any], summary: BatchSummary, is_error: bool) -> None:
    if is_error:
        summary.failed += 1
        return
    summary.completed += 1
    usage = ((record.get("response") or {}).get("body") or {}).get("usage") or {}
    summary.prompt_tokens += usage.get("prompt_tokens", 0)
    summary.completion_tokens += usage.get("completion_tokens", 0)
    details = usage.get("prompt_tokens_details") or {}
    summary.cached_tokens += details.get("cached_tokens", 0)


def main(args: Any, config: EngineConfig) -> int:
    """``grammarserve batch IN -o OUT --ray [--address] [--replicas]``: exit code 0, or 130
    when interrupted (resumable)."""
    from tqdm import tqdm

    from grammarserve.batch.cli import default_errors_path

    if not args.input.is_file():
        raise InvalidRequestError(f"input file {args.input} does not exist", param="input")
    errors = args.errors or default_errors_path(args.output)
    started = not ray.is_initialized()
    if started:
        ray.init(address=args.address)
    bar: Any = None
    try:
        def on_start(todo: int) -> None:
            nonlocal bar
            bar = tqdm(total=todo, unit="line", dynamic_ncols=True, disable=args.no_progress)

        summary = run_file(args.input, args.output, errors,
                           RayBatchConfig(config, replicas=args.replicas, max_n=args.max_n),
                           progress=lambda n, _: bar.update(n), on_start=on_start)
    finally:
        if bar is not None:
            bar.close()
        if started:
            ray.shutdown()
    return summary.report(f"grammarserve batch on Ray ({args.replicas} replicas)", args.output,
                          errors, args.summary)
