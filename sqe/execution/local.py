"""Local execution: stream the record batches of a ScanPlan, reading its file tasks in a bounded thread pool.

Each file is streamed batch by batch through pyiceberg's private generator ``_task_to_record_batches`` (the
public ``ArrowScan.to_record_batches`` materialises each file). At most ``max_files_in_flight`` files are open and
at most ``max_queued_batches`` batches wait in the queue, so memory stays bounded whatever the table size. The
consumer polls a cancel event, so an interrupted query stops within one poll interval even when no batch comes.
"""

from __future__ import annotations

import inspect
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyiceberg
from pyiceberg.io import pyarrow as _pyiceberg_arrow

from sqe.errors import QueryError

if TYPE_CHECKING:
    from pyiceberg.table import FileScanTask

    from sqe.planning.planner import ReadSpec

BatchTransform = Callable[[pa.RecordBatch], pa.RecordBatch]

# Private pyiceberg functions SQE relies on, with the parameters it passes (verified against pyiceberg 0.12).
_PINNED: dict[str, tuple[str, ...]] = {
    "_task_to_record_batches": (
        "io",
        "task",
        "bound_row_filter",
        "projected_schema",
        "table_schema",
        "projected_field_ids",
        "positional_deletes",
        "case_sensitive",
        "name_mapping",
        "partition_spec",
        "format_version",
    ),
    "_read_deletes": ("io", "data_file"),
}


def _verify_pinned_pyiceberg() -> None:
    for name, expected in _PINNED.items():
        fn = getattr(_pyiceberg_arrow, name, None)
        params = tuple(inspect.signature(fn).parameters) if fn is not None else ()
        if params[: len(expected)] != expected:
            raise ImportError(
                f"pyiceberg {pyiceberg.__version__} changed pyiceberg.io.pyarrow.{name}; "
                "SQE's streaming reader supports pyiceberg 0.12"
            )


_verify_pinned_pyiceberg()
_task_to_record_batches: Callable[..., Iterator[pa.RecordBatch]] = _pyiceberg_arrow._task_to_record_batches
_read_deletes: Callable[..., dict[str, pa.ChunkedArray]] = _pyiceberg_arrow._read_deletes


class FileScanSource(Protocol):
    """What the executor reads: a ``ScanPlan`` locally, a ticket's rebuilt tasks on a scan worker."""

    @property
    def tasks(self) -> tuple[FileScanTask, ...]: ...

    @property
    def read(self) -> ReadSpec: ...

    @property
    def ident(self) -> object: ...  # names the reader threads


class QueryCancelledError(QueryError):
    """The query was interrupted (``Session.interrupt()`` or Ctrl-C)."""

    def __init__(self, message: str = "query cancelled") -> None:
        super().__init__(message)


@dataclass
class ScanMetrics:
    """Counters of one or more scans, safe to read from another thread (progress bars, tests)."""

    files_total: int = 0
    files_done: int = 0
    bytes_done: int = 0
    rows_produced: int = 0
    batches_produced: int = 0
    batches_in_flight: int = 0  # produced by a reader thread, not yet handed to the consumer
    max_batches_in_flight: int = 0
    max_files_in_flight: int = 0
    files_open: int = 0
    scans_opened: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)
            self.max_batches_in_flight = max(self.max_batches_in_flight, self.batches_in_flight)
            self.max_files_in_flight = max(self.max_files_in_flight, self.files_open)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {k: v for k, v in vars(self).items() if not k.startswith("_")}


@dataclass(frozen=True)
class _Done:
    pass


@dataclass(frozen=True)
class _Failed:
    error: BaseException


_DONE = _Done()


class LocalExecutor:
    def __init__(self, *, max_files_in_flight: int = 4, max_queued_batches: int = 8, poll_seconds: float = 0.05):
        if max_files_in_flight < 1 or max_queued_batches < 1:
            raise ValueError("max_files_in_flight and max_queued_batches must be at least 1")
        self.max_files_in_flight = max_files_in_flight
        self.max_queued_batches = max_queued_batches
        self.poll_seconds = poll_seconds

    def record_batches(
        self,
        plan: FileScanSource,
        *,
        cancel: threading.Event | None = None,
        transform: BatchTransform | None = None,
        metrics: ScanMetrics | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Stream the plan's batches (file order is not preserved). Nothing starts until the first ``next()``."""
        run = _ScanRun(self, plan, cancel or threading.Event(), transform, metrics or ScanMetrics())
        return run.batches()


class _ScanRun:
    """One pass over a plan's tasks: reader threads feed a bounded queue, the caller's thread consumes it."""

    def __init__(
        self,
        executor: LocalExecutor,
        plan: FileScanSource,
        cancel: threading.Event,
        transform: BatchTransform | None,
        metrics: ScanMetrics,
    ) -> None:
        self._executor = executor
        self._plan = plan
        self._cancel = cancel
        self._transform = transform
        self._metrics = metrics
        self._stop = threading.Event()  # set by the consumer when it leaves, for any reason
        self._queue: queue.Queue[pa.RecordBatch | _Done | _Failed] = queue.Queue(executor.max_queued_batches)
        self._tasks: Iterator[FileScanTask] = iter(plan.tasks)
        self._tasks_lock = threading.Lock()
        self._deletes = _DeleteCache(plan)

    def batches(self) -> Iterator[pa.RecordBatch]:
        self._raise_if_cancelled()
        self._metrics.add(scans_opened=1, files_total=len(self._plan.tasks))
        workers = [
            threading.Thread(target=self._work, name=f"sqe-scan-{self._plan.ident}", daemon=True)
            for _ in range(min(self._executor.max_files_in_flight, len(self._plan.tasks)))
        ]
        for worker in workers:
            worker.start()
        try:
            yield from self._consume(len(workers))
        finally:
            self._stop.set()
            self._drain()
            for worker in workers:
                worker.join(timeout=self._executor.poll_seconds)

    def _consume(self, running: int) -> Iterator[pa.RecordBatch]:
        while running:
            self._raise_if_cancelled()
            try:
                item = self._queue.get(timeout=self._executor.poll_seconds)
            except queue.Empty:
                continue
            if isinstance(item, _Done):
                running -= 1
            elif isinstance(item, _Failed):
                raise item.error
            else:
                self._metrics.add(batches_in_flight=-1)
                yield item

    def _work(self) -> None:
        try:
            while not self._stop.is_set():
                task = self._next_task()
                if task is None:
                    break
                self._read_file(task)
        except BaseException as exc:  # handed to the consumer, which re-raises it in the query's thread
            self._put(_Failed(exc))
        finally:
            self._put(_DONE)

    def _next_task(self) -> FileScanTask | None:
        with self._tasks_lock:
            return next(self._tasks, None)

    def _read_file(self, task: FileScanTask) -> None:
        read = self._plan.read
        self._metrics.add(files_open=1)
        try:
            batches = _task_to_record_batches(
                read.io,
                task,
                read.bound_row_filter,
                read.projected_schema,
                read.table_schema,
                set(read.projected_field_ids),
                self._deletes.for_file(task),
                read.case_sensitive,
                read.name_mapping,
                read.specs.get(task.file.spec_id),
                read.format_version,
            )
            for batch in batches:
                if self._stop.is_set():
                    return
                out = self._transform(batch) if self._transform is not None else batch
                self._metrics.add(batches_in_flight=1, batches_produced=1, rows_produced=out.num_rows)
                if not self._put(out):
                    self._metrics.add(batches_in_flight=-1)
                    return
        finally:
            self._metrics.add(files_open=-1)
        self._metrics.add(files_done=1, bytes_done=task.file.file_size_in_bytes)

    def _put(self, item: pa.RecordBatch | _Done | _Failed) -> bool:
        """Block while the queue is full; give up once the consumer has gone."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=self._executor.poll_seconds)
                return True
            except queue.Full:
                continue
        return False

    def _drain(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, pa.RecordBatch):
                self._metrics.add(batches_in_flight=-1)

    def _raise_if_cancelled(self) -> None:
        if self._cancel.is_set():
            raise QueryCancelledError()


class _DeleteCache:
    """Positional delete files, each read once per scan run however many data files it covers."""

    def __init__(self, plan: FileScanSource) -> None:
        self._io = plan.read.io
        self._lock = threading.Lock()
        self._path_locks: dict[str, threading.Lock] = {}
        self._contents: dict[str, dict[str, Any]] = {}

    def for_file(self, task: FileScanTask) -> list[pa.ChunkedArray] | None:
        if not task.delete_files:
            return None
        positions: list[pa.ChunkedArray] = []
        for delete_file in sorted(task.delete_files, key=lambda d: d.file_path):
            chunk = self._read(delete_file).get(task.file.file_path)
            if chunk is not None:
                positions.append(chunk)
        return positions or None

    def _read(self, delete_file: Any) -> dict[str, Any]:
        path: str = delete_file.file_path
        with self._lock:
            path_lock = self._path_locks.setdefault(path, threading.Lock())
        with path_lock:  # single flight: concurrent readers of the same delete file wait for the first
            if path not in self._contents:
                self._contents[path] = _read_deletes(self._io, delete_file)
            return self._contents[path]
