"""Distributed compaction: the coordinator sends each bin to a worker (``Rewrite``) and collects the files written.

The coordinator chooses every output path (under the table's data location, unique per attempt), so it always
knows what an attempt may have left behind: when an attempt fails (the worker died, the store failed) its paths
are deleted with the coordinator's own table FileIO BEFORE the bin is retried on another worker, and when the
compaction fails as a whole every output written so far is deleted. Only the coordinator commits
(``sqe.execution.compaction.commit_replace``).

Credentials are those of distributed scans (``[coordinator] distributed_credentials``): the sets the catalog
vended at load-table (write-capable when the user holds write access; the store enforces it), registered with
the table's lease so long rewrites get refreshed sets pushed, and the ``[storage]`` pair only in ``static`` /
``auto`` mode.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import sanitize_column_names

from sqe._text import counted, first_line
from sqe.distributed.coordinator.credentials import TableCredentials, wire_table_id
from sqe.distributed.coordinator.failures import classify_rpc_error
from sqe.distributed.coordinator.refresh import Holder
from sqe.distributed.protocol.rewrite import (
    MAX_OUTPUT_PATHS,
    build_rewrite_ticket,
    decode_file_stats,
    encode_file_stats,
)
from sqe.distributed.protocol.ticket import trim_metadata
from sqe.errors import SQEError, WorkerError
from sqe.execution.write_target import check_data_path, data_path

if TYPE_CHECKING:
    from pyiceberg.io.fileformat import DataFileStatistics
    from pyiceberg.io.pyarrow import StatisticsCollector
    from pyiceberg.table import FileScanTask

    from sqe.catalog.base import LoadedTable
    from sqe.credentials import CredentialSet
    from sqe.distributed.coordinator.client import WorkerClient
    from sqe.distributed.coordinator.executor import DistributedExecutor

log = logging.getLogger(__name__)


@dataclass
class _Job:
    """One bin and every output path any of its attempts was allowed to write."""

    index: int
    tasks: list[FileScanTask]
    attempted_paths: list[str] = field(default_factory=list)
    outputs: list[DataFile] = field(default_factory=list)


def rewrite_on_workers(
    executor: DistributedExecutor, loaded: LoadedTable, bins: list[list[FileScanTask]], target: int
) -> list[DataFile]:
    """Rewrite every bin on the workers; returns the new files (not committed). On failure nothing is left."""
    run = _CompactionRun(executor, loaded, target)
    return run.rewrite(bins)


class _CompactionRun:
    def __init__(self, executor: DistributedExecutor, loaded: LoadedTable, target: int) -> None:
        self._executor = executor
        self._loaded = loaded
        self._target = target
        self._query_id = f"optimize-{uuid.uuid4().hex[:16]}"
        self._metadata_json = trim_metadata(loaded.table.metadata)
        self._dead: set[str] = set()
        self._lock = threading.Lock()
        self._failed = threading.Event()
        self._credentials: TableCredentials | None = None

    def rewrite(self, bins: list[list[FileScanTask]]) -> list[DataFile]:
        tasks = [task for group in bins for task in group]
        self._credentials = self._executor.credentials_for(self._loaded.ident, self._loaded, tasks)
        jobs = [_Job(i, group) for i, group in enumerate(bins)]
        slots = max(1, len(self._executor.clients) * self._executor.options.slots_per_worker)
        errors: list[BaseException] = []
        with ThreadPoolExecutor(max_workers=min(slots, len(jobs)), thread_name_prefix="sqe-rewrite") as pool:
            futures = [pool.submit(self._run_job, job) for job in jobs]
            for future in futures:
                error = future.exception()
                if error is not None:
                    errors.append(error)
        if errors:
            self._delete([path for job in jobs for path in job.attempted_paths])
            first = errors[0]
            if isinstance(first, SQEError):
                raise first
            raise WorkerError(f"OPTIMIZE {self._loaded.ident}: a rewrite failed ({type(first).__name__})")
        return [data_file for job in jobs for data_file in job.outputs]

    # -- one bin ------------------------------------------------------------------------------------------

    def _run_job(self, job: _Job) -> None:
        options = self._executor.options
        last = "no worker was available"
        attempt = 0
        while attempt < options.max_attempts:
            if self._failed.is_set():
                return
            client = self._pick(job.index + attempt)
            if client is None:
                break
            attempt += 1
            paths = self._output_paths(job, attempt)
            job.attempted_paths.extend(paths)
            try:
                job.outputs = self._attempt(client, job, attempt, paths)
                return
            except grpc.RpcError as exc:
                secrets = client.secret_values() | self._credentials_secrets()
                where = f"{self._query_id}/{job.index}"
                failure = classify_rpc_error(exc, client.address, where, timed_out=False, secrets=secrets)
                self._delete(paths)  # nothing of a failed attempt may survive it, before anything is retried
                if failure.fatal is not None:
                    self._failed.set()
                    raise failure.fatal from None
                if failure.worker_dead:
                    with self._lock:
                        self._dead.add(client.address)
                if failure.busy:
                    time.sleep(options.busy_retry_seconds)
                last = failure.message
                self._executor.stats.add(fragments_retried=1)
                log.warning("OPTIMIZE %s: bin %d attempt %d failed: %s", self._loaded.ident, job.index, attempt, last)
        self._failed.set()
        raise WorkerError(f"OPTIMIZE {self._loaded.ident}: bin {job.index} could not be rewritten: {last}")

    def _credentials_secrets(self) -> frozenset[str]:
        """The table's keys a rewrite ticket carries (or a push brought): never repeated from a worker's error."""
        return self._credentials.secret_values() if self._credentials is not None else frozenset()

    def _pick(self, start: int) -> WorkerClient | None:
        clients = self._executor.clients
        with self._lock:
            alive = [c for c in clients if c.address not in self._dead]
        return alive[start % len(alive)] if alive else None

    def _attempt(self, client: WorkerClient, job: _Job, attempt: int, paths: list[str]) -> list[DataFile]:
        fragment_id = f"{self._query_id}/{job.index}/{attempt}"
        holder = Holder(client.address, self._query_id, fragment_id)
        credentials = self._credentials
        assert credentials is not None
        vended: tuple[CredentialSet, ...] = credentials.vended
        lease = credentials.lease
        if lease is not None:
            vended, _generation = self._executor.refresher.register(lease, holder)
        try:
            ticket = build_rewrite_ticket(
                query_id=self._query_id,
                fragment_id=fragment_id,
                table=wire_table_id(self._loaded.ident),
                metadata_json=self._metadata_json,
                tasks=job.tasks,
                credentials=credentials.for_tasks(job.tasks, vended),
                output_paths=paths,
                target_file_size=self._target,
                pace_ms_per_file=self._executor.options.pace_ms_per_file,
            )
            self._executor.stats.add(fragments_started=1)
            response = client.rewrite(ticket, timeout=self._executor.options.rewrite_timeout_seconds).result()
        finally:
            if lease is not None:
                self._executor.refresher.unregister(lease, holder)
        self._executor.stats.add(fragments_completed=1)
        return self._data_files(job, response, paths)

    def _data_files(self, job: _Job, response: Any, paths: list[str]) -> list[DataFile]:
        """The files the worker says it wrote, as committed: each one of this attempt's paths, at most once, and
        described by its own footer in the store (row count, size, statistics), never by the worker's word; their
        rows must be what the bin can give. Anything else is a ``WorkerError`` (the attempt's paths are deleted)."""
        allowed = set(paths)
        reported = [written.file_path for written in response.files]
        if not set(reported) <= allowed:  # never commit a file the coordinator did not ask for
            raise WorkerError(f"OPTIMIZE {self._loaded.ident}: a worker reported an unexpected output file")
        if len(set(reported)) != len(reported):  # one file twice would commit its rows twice
            raise WorkerError(f"OPTIMIZE {self._loaded.ident}: a worker reported an output file twice")
        first = job.tasks[0].file
        files: list[DataFile] = []
        for written in response.files:
            statistics, size = self._stored(written.file_path)
            if statistics.record_count != written.record_count or size != written.file_size_in_bytes:
                raise WorkerError(
                    f"OPTIMIZE {self._loaded.ident}: a worker reported an output of {written.record_count} rows and "
                    f"{written.file_size_in_bytes} bytes; the store holds {statistics.record_count} rows and {size} "
                    "bytes"
                )
            serialized = statistics.to_serialized_dict()
            # Both from pyiceberg's statistics of the same footer: any difference is a worker not saying what it wrote.
            if decode_file_stats(written.stats_json) != decode_file_stats(encode_file_stats(serialized)):
                raise WorkerError(
                    f"OPTIMIZE {self._loaded.ident}: a worker reported other column statistics than its output's "
                    "footer holds"
                )
            data_file = DataFile.from_args(
                self._loaded.table.metadata.format_version,
                content=DataFileContent.DATA,
                file_path=written.file_path,
                file_format=FileFormat.PARQUET,
                partition=first.partition,
                file_size_in_bytes=size,
                sort_order_id=None,
                equality_ids=None,
                key_metadata=None,
                **serialized,
            )
            data_file.spec_id = first.spec_id
            files.append(data_file)
        self._check_rows(job, sum(f.record_count for f in files), response.rows)
        return files

    @cached_property
    def _statistics_plan(self) -> tuple[dict[int, StatisticsCollector], dict[str, int]]:
        """What pyiceberg's writer collects per column, and the Parquet path -> field id mapping, for the outputs'
        schema (the same for every output of the run)."""
        metadata = self._loaded.table.metadata
        file_schema = sanitize_column_names(metadata.schema())  # as the worker writes (workers.rewrite)
        return compute_statistics_plan(file_schema, metadata.properties), parquet_path_to_id_mapping(file_schema)

    def _stored(self, path: str) -> tuple[DataFileStatistics, int]:
        """An output's statistics from its own Parquet footer (as the worker's writer computed them) and its size."""
        stats_columns, column_mapping = self._statistics_plan
        try:
            with self._loaded.table.io.new_input(path).open() as stream:
                footer, size = pq.read_metadata(stream), stream.seek(0, os.SEEK_END)  # no second HEAD for the size
            statistics = data_file_statistics_from_parquet_metadata(
                parquet_metadata=footer, stats_columns=stats_columns, parquet_column_mapping=column_mapping
            )
            return statistics, size
        except (OSError, ValueError, KeyError, pa.ArrowException) as exc:
            raise WorkerError(
                f"OPTIMIZE {self._loaded.ident}: an output a worker reported cannot be read back as the table's "
                f"Parquet ({type(exc).__name__})"
            ) from None

    def _check_rows(self, job: _Job, written: int, reported: int) -> None:
        """The bin's rows after its deletes: all of its files' rows without deletes, never more than those, and
        with position deletes only, at most as many fewer as those delete (equality deletes bound nothing)."""
        records = sum(task.file.record_count for task in job.tasks)
        # Counted per task: a delete file applying to several of them counts for each (a looser bound, never a
        # tighter one; deletion vectors share one Puffin file's path).
        deletes = [d for task in job.tasks for d in task.delete_files]
        if all(d.content == DataFileContent.POSITION_DELETES for d in deletes):
            fewest = max(0, records - sum(d.record_count for d in deletes))
        else:
            fewest = 0
        if written != reported or not fewest <= written <= records:
            raise WorkerError(
                f"OPTIMIZE {self._loaded.ident}: a worker wrote {counted(written, 'row')} (and reported {reported}) "
                f"for a bin of {counted(records, 'row')} whose deletes leave {fewest} to {records}"
            )

    # -- paths --------------------------------------------------------------------------------------------

    def _output_paths(self, job: _Job, attempt: int) -> list[str]:
        """Fresh, unique paths for one attempt, in the bin's partition directory under the data location."""
        metadata = self._loaded.table.metadata
        first = job.tasks[0].file
        data_dir = data_path(metadata.location, metadata.properties)
        check_data_path(self._loaded, data_dir)
        spec = metadata.specs().get(first.spec_id)
        if spec is not None and spec.fields:
            data_dir = f"{data_dir.rstrip('/')}/{spec.partition_to_path(first.partition, metadata.schema())}"
        count = max(1, min(MAX_OUTPUT_PATHS, len(job.tasks)))
        token = uuid.uuid4().hex
        return [
            f"{data_dir.rstrip('/')}/compact-{token}-{job.index:05d}-{attempt}-{i:03d}.parquet" for i in range(count)
        ]

    def _delete(self, paths: list[str]) -> None:
        io = self._loaded.table.io
        for path in paths:
            try:
                if io.new_input(path).exists():
                    io.delete(path)
            except Exception as exc:  # best effort: the file is unreferenced either way; say which one stayed
                log.warning("OPTIMIZE: could not delete unreferenced output %s: %s", path, first_line(exc))
