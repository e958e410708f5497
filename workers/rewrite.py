"""The worker half of distributed compaction: read one bin (deletes applied) and write it to the given paths.

The bin is read as pyiceberg's ``ArrowScan`` reads it, each data file's rows counted
(:func:`sqe.execution.projected_read.rewrite_rows`), through a :class:`RewriteFileIO`: the fragment FileIO (the
ticket's credential sets only, expiry checked per file, pushed sets swapped in between files) that may also
write, but ONLY the exact output paths the ticket names, each at most once, and never deletes anything: any
other write fails closed. Files are written like pyiceberg writes data files (the table schema with field ids,
Parquet statistics per the table's metrics settings), and their statistics go back to the coordinator, which
alone commits them (or deletes them).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
from pyiceberg.io import InputFile, OutputFile
from pyiceberg.io.fileformat import FileFormatFactory
from pyiceberg.io.pyarrow import _to_requested_schema, bin_pack_arrow_table
from pyiceberg.manifest import FileFormat
from pyiceberg.schema import sanitize_column_names

from sqe.credentials import CredentialSet, StorageSettings, normalize_location
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.rewrite import DecodedRewrite, encode_file_stats
from sqe.errors import WorkerError
from sqe.execution.delete_limits import check_task_deletes
from sqe.execution.local import QueryCancelledError
from sqe.execution.projected_read import rewrite_rows
from workers.fileio import FragmentFileIO, OpenCallback
from workers.fragment import RunningCall

if TYPE_CHECKING:
    from workers.fragment import WorkerStats


class OutputNotAllowedError(WorkerError):
    """A write to a path the rewrite ticket does not name (or a second write to one it does)."""


class RewriteFileIO(FragmentFileIO):
    """A fragment FileIO that may write exactly the ticket's output paths, once each, and delete nothing."""

    def __init__(
        self,
        credentials: Sequence[CredentialSet],
        storage: StorageSettings,
        outputs: Sequence[str],
        *,
        cancel: threading.Event,
        pace_seconds: float = 0.0,
        on_open: OpenCallback | None = None,
    ) -> None:
        super().__init__(credentials, storage, cancel=cancel, pace_seconds=pace_seconds, on_open=on_open)
        self._allowed = {normalize_location(p) for p in outputs}
        self._written: set[str] = set()
        self._output_lock = threading.Lock()

    def new_output(self, location: str) -> OutputFile:
        normalized = normalize_location(location)
        with self._output_lock:
            if normalized not in self._allowed or normalized in self._written:
                raise OutputNotAllowedError(f"this rewrite may not write {location} (not one of its output paths)")
            self._written.add(normalized)
        if self._cancel.is_set():
            raise QueryCancelledError()
        scoped, _ = self._covering(location)
        return scoped.new_output(location)

    def delete(self, location: str | InputFile | OutputFile) -> None:
        raise WorkerError("rewrites never delete files (the coordinator removes unused outputs)")

    def after_output(self) -> None:
        """Test-only pacing after a finished output: a worker killed now leaves a written, uncommitted file."""
        self._pace()

    def __repr__(self) -> str:
        return f"RewriteFileIO(outputs={len(self._allowed)})"


class RunningRewrite(RunningCall[DecodedRewrite, RewriteFileIO]):
    """One Rewrite call, registered beside fragments so Cancel and RefreshCredentials reach it."""

    def run(self, stats: WorkerStats) -> pb.RewriteResponse:
        ticket = self.ticket
        metadata = ticket.metadata
        checked = check_task_deletes(self.io, ticket.tasks)  # each delete file is read whole
        rows = rewrite_rows(metadata, self.io, checked, ticket.tasks)  # each data file's rows counted
        if self.cancel.is_set():
            raise QueryCancelledError()
        written = [
            self._write(path, chunk, stats)
            for path, chunk in zip(ticket.output_paths, _chunks(rows, ticket), strict=False)
        ]
        return pb.RewriteResponse(files=written, rows=rows.num_rows, files_read=len(ticket.tasks))

    def _write(self, path: str, batches: list[pa.RecordBatch], stats: WorkerStats) -> pb.WrittenFile:
        metadata = self.ticket.metadata
        table_schema = metadata.schema()
        file_schema = sanitize_column_names(table_schema)
        model = FileFormatFactory.get(FileFormat.PARQUET)
        conformed = [
            _to_requested_schema(
                requested_schema=file_schema,
                file_schema=table_schema,
                batch=batch,
                include_field_ids=True,
                format_model=model,
            )
            for batch in batches
        ]
        output = self.io.new_output(path)
        writer = model.create_writer(output, file_schema, metadata.properties)
        with writer:
            writer.write(pa.Table.from_batches(conformed))
        serialized = writer.result().to_serialized_dict()
        stats.add(rewrite_files_written=1)
        self.io.after_output()
        return pb.WrittenFile(
            file_path=path,
            file_size_in_bytes=len(output),
            record_count=int(serialized["record_count"]),
            stats_json=encode_file_stats(serialized),
        )


def _chunks(rows: pa.Table, ticket: DecodedRewrite) -> list[list[pa.RecordBatch]]:
    """Batches per output file: about ``target_file_size`` each; the last path takes whatever remains."""
    if rows.num_rows == 0:
        return []
    packed = list(bin_pack_arrow_table(rows, ticket.target_file_size))
    limit = len(ticket.output_paths)
    if len(packed) > limit:
        packed = [*packed[: limit - 1], [b for group in packed[limit - 1 :] for b in group]]
    return packed
