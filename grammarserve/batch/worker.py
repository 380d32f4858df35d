"""The server's batch worker: moves batches through validating -> in_progress -> finalizing ->
completed (or cancelling -> cancelled, or failed), one batch at a time, on its own thread and
event loop, sharing the server's engine process with interactive traffic.

# NOTE: priority. At most ``max_in_flight`` batch lines are in the engine at once (by default half
# its request rows), so interactive requests always find rows free; the rest of the batch waits
# here, not in the engine's queue.

# NOTE: durability. A line counts as done once its record is fsynced in the batch's output or
# error file; the files, not the database counters, say what is done. A batch found in_progress at
# start-up (the server was killed) resumes with the lines the files do not hold yet.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from grammarserve.batch.lines import (
    MAX_LINES,
    InputLine,
    InputReader,
    error_entry,
    error_line,
    failure_line,
    index_input,
    response_line,
)
from grammarserve.batch.results import Done, ResultFile, scan, todo_lines
from grammarserve.batch.store import BatchStore
from grammarserve.errors import EngineDeadError
from grammarserve.openai.bodies import new_id
from grammarserve.openai.context import ModelContext
from grammarserve.openai.endpoints import prepare_body, reply_body
from grammarserve.openai.generation import EngineClient, Generation, Timings
from grammarserve.openai.tenancy import TenantClient

log = logging.getLogger(__name__)
_POLL_S = 0.25
#: Seconds between sweeps of expired files while the worker is idle.
_SWEEP_S = 60.0
_MAX_ERRORS_LISTED = 100


class _Stop(Exception):
    """The engine died or the server is stopping: leave the batch in_progress; the worker
    resumes it once the engine is back (or the server starts again)."""


class BatchEngine(EngineClient, Protocol):
    """What the worker needs of the server: submit / abort engine requests, whether the engine
    is ready (or failed to load), and the model context once it is."""

    @property
    def ready(self) -> bool: ...

    @property
    def failed(self) -> bool: ...

    @property
    def context(self) -> ModelContext | None: ...

    @property
    def timings(self) -> Timings | None: ...


class BatchWorker:
    """Runs the store's active batches through ``engine`` (the server's)."""

    def __init__(self, store: BatchStore, engine: BatchEngine, *, max_in_flight: int) -> None:
        self.store = store
        self.engine = engine
        self.max_in_flight = max(1, max_in_flight)
        self.current: str | None = None  # id of the batch being run
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = threading.Event()
        self._swept = time.monotonic()

    # -- lifecycle (called from the server's thread) ------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, daemon=True,
                                        name="grammarserve-batch")
        self._thread.start()

    def stop(self, timeout: float = 15.0) -> None:
        self._stopping.set()
        self.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def notify(self) -> None:
        """Wake the worker (a batch was created or cancelled)."""
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop already ended
                pass

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except Exception:  # a worker bug must not take the server down; batches stay resumable
            log.exception("the batch worker stopped")

    # -- the worker loop ------------------------------------------------------------------------
    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        while not self._stopping.is_set():
            if not self.engine.ready:  # loading, or a dead engine being restarted
                if self.engine.failed:
                    return
                await asyncio.sleep(_POLL_S)
                continue
            ctx = self.engine.context
            assert ctx is not None  # set once ready
            active = self.store.active_batches()
            if not active:
                if time.monotonic() - self._swept >= _SWEEP_S:  # files nobody looks up
                    self._swept = time.monotonic()
                    await asyncio.to_thread(self.store.sweep_expired)
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=1.0)
                except asyncio.TimeoutError:
                    pass
                continue
            try:
                await self._advance(active[0], ctx)
            except _Stop:  # the engine died or we stop: resume from the result files later
                continue
            except Exception as e:  # a bug: fail this batch (its files stay), keep serving
                log.exception("batch %s failed", active[0]["id"])
                self._fail(active[0]["id"], "internal_error", f"{type(e).__name__}: {e}")

    async def _advance(self, batch: dict[str, Any], ctx: ModelContext) -> None:
        bid, status = batch["id"], batch["status"]
        if status == "cancelling":
            await asyncio.to_thread(self.finalize, bid, "cancelled")
        elif status == "finalizing":
            await asyncio.to_thread(self.finalize, bid, "completed")
        else:
            self.current = bid
            try:
                await self._execute(batch, ctx)
            finally:
                self.current = None

    def _paths(self, bid: str) -> tuple[Path, Path]:
        d = self.store.batch_dir(bid)
        return d / "output.jsonl", d / "errors.jsonl"

    def finalize(self, bid: str, status: str) -> None:
        """Register the output and error files and end the batch in ``status``."""
        out_path, err_path = self._paths(bid)
        done = scan(out_path, err_path)
        batch = self.store.get_batch(bid, tenant=None)
        tenant = batch["tenant"] if batch is not None else ""
        ids: dict[str, str | None] = {}
        for key, path in (("output_file_id", out_path), ("error_file_id", err_path)):
            ids[key] = None
            if path.exists() and path.stat().st_size > 0:
                kind = "output" if key == "output_file_id" else "error"
                ids[key] = self.store.register_file(path, f"{bid}_{kind}.jsonl",
                                                    "batch_output", tenant=tenant)["id"]
        self.store.set_status(bid, status, completed=done.completed, failed=done.failed,
                              output_file_id=ids["output_file_id"],
                              error_file_id=ids["error_file_id"])

    def _fail(self, bid: str, code: str, message: str,
              errors: list[dict[str, Any]] | None = None) -> None:
        data = errors or [{"code": code, "line": None, "message": message, "param": None}]
        self.store.set_status(bid, "failed", errors=data)

    async def _execute(self, batch: dict[str, Any], ctx: ModelContext) -> None:
        """Validate (first time) and run a batch's remaining lines, then finalize it."""
        bid = batch["id"]
        row = self.store.get_file(batch["input_file_id"], tenant=batch["tenant"],
                                  include_expired=True)  # expired while queued: still kept
        if row is None or not Path(row["path"]).exists():
            self._fail(bid, "file_not_found", f"input file {batch['input_file_id']} not found")
            return
        index = await asyncio.to_thread(index_input, Path(row["path"]),
                                        endpoint=batch["endpoint"])
        listed = [error_entry(e) for e in index.errors[:_MAX_ERRORS_LISTED]]
        if index.total > MAX_LINES:
            self._fail(bid, "too_many_requests", f"the input file has {index.total} requests; "
                       f"the limit is {MAX_LINES}")
            return
        if not index.lines:
            self._fail(bid, "empty_file", "the input file has no valid request line", listed)
            return
        out_path, err_path = self._paths(bid)
        done = await asyncio.to_thread(scan, out_path, err_path)
        bad = [e for e in index.errors if e.line not in done.lines]
        todo = todo_lines(index, done)
        self.store.update_batch(bid, total=index.total, completed=done.completed,
                                failed=done.failed, errors=listed or None)
        if batch["status"] == "validating" and not self.store.set_status(
                bid, "in_progress", only_from=("validating",)):
            return  # cancelled meanwhile: the next round finalizes it
        with ResultFile(out_path) as out, ResultFile(err_path) as err, \
                InputReader(Path(row["path"])) as reader:
            await asyncio.to_thread(err.write, [error_line(e) for e in bad])
            done.failed += len(bad)
            run = _BatchRun(self, bid, batch["tenant"], ctx, reader, out, err, done)
            cancelled = await run.run(todo)
        if cancelled:
            await asyncio.to_thread(self.finalize, bid, "cancelled")
        elif self.store.set_status(bid, "finalizing", only_from=("in_progress",)):
            await asyncio.to_thread(self.finalize, bid, "completed")


class _BatchRun:
    """The in-progress part of one batch: its lines as concurrent tasks, bounded."""

    def __init__(self, worker: BatchWorker, bid: str, tenant: str, ctx: ModelContext,
                 reader: InputReader, out: ResultFile, err: ResultFile, done: Done) -> None:
        self.worker = worker
        self.bid = bid
        self.client = TenantClient(worker.engine, tenant)  # the batch owner's cache namespace
        self.ctx = ctx
        self.reader = reader
        self.out = out
        self.err = err
        self.done = done
        self.cancelled = False
        self.stop: BaseException | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def run(self, todo: list[InputLine]) -> bool:
        """Run ``todo``; True if the batch was cancelled. Raises :class:`_Stop`."""
        slots = asyncio.Semaphore(self.worker.max_in_flight)
        monitor = asyncio.create_task(self._monitor())
        try:
            for line in todo:
                await slots.acquire()
                if self.cancelled or self.stop is not None:
                    slots.release()
                    break
                task = asyncio.create_task(self._line(line))
                self.tasks.add(task)

                def done(t: asyncio.Task[None]) -> None:
                    self.tasks.discard(t)
                    slots.release()

                task.add_done_callback(done)
            if self.tasks:
                await asyncio.gather(*self.tasks, return_exceptions=True)
        finally:
            monitor.cancel()
            self._save_counts()
        if self.stop is not None:
            raise _Stop() from self.stop
        return self.cancelled

    def _save_counts(self) -> None:
        self.worker.store.update_batch(self.bid, completed=self.done.completed,
                                       failed=self.done.failed)

    def _halt(self, cancelled: bool, reason: BaseException | None = None) -> None:
        if cancelled:
            self.cancelled = True
        elif self.stop is None:
            self.stop = reason or _Stop()
        for t in self.tasks:
            t.cancel()  # Generation aborts the engine requests of a cancelled line

    async def _monitor(self) -> None:
        """Publish counts, and notice cancellation (this batch's, or a queued one's) and
        shutdown."""
        store = self.worker.store
        while True:
            await asyncio.sleep(_POLL_S)
            self._save_counts()
            if self.worker.stopping or not self.worker.engine.ready:
                self._halt(False)
                return
            for b in store.active_batches():
                if b["status"] != "cancelling":
                    continue
                if b["id"] == self.bid:
                    self._halt(True)
                    return
                await asyncio.to_thread(self.worker.finalize, b["id"], "cancelled")

    async def _line(self, line: InputLine) -> None:
        engine = self.worker.engine
        try:
            prep = prepare_body(self.ctx, line.url, self.reader.body(line))
            prep.check_constraint()
            gen = Generation(self.client, prep, base_id=new_id("batchreq"),
                             timings=engine.timings)
            gen.start()
            outs = await gen.results(None)
            assert outs is not None  # no disconnect watcher
            record = response_line(line.custom_id, 200, reply_body(self.ctx, prep, outs))
        except EngineDeadError as e:
            self._halt(False, e)
            return
        except Exception as e:  # noqa: BLE001 - the line fails (a bug too), never lost
            record = failure_line(line.custom_id, e, line.line)
        ok = record["response"]["status_code"] == 200
        await asyncio.to_thread((self.out if ok else self.err).write, [record])
        self.done.add(record, error_file=not ok)
