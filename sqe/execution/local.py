"""Local execution: stream the record batches of a ScanPlan, reading its file tasks in a bounded thread pool.

Each file is streamed batch by batch (pyiceberg's public ``ArrowScan.to_record_batches`` materialises each file).
A Parquet file without positional deletes whose columns need no Iceberg projection (same field ids and types,
all present, primitive) is read directly with pyarrow, in batches of about ``target_batch_bytes``: by pyarrow's
Parquet reader over the kept footer when its reads stay native (a local file, or a range-cached file kept whole),
else by a dataset scanner (a row filter applies; an object store without the range cache, where only the scanner
opens a file without a HEAD; a range-cached file read range by range, whose row groups the scanner decodes in
parallel). Any other Parquet file goes through :mod:`sqe.execution.projected_read`, pyiceberg's reader step for
step (deletes, schema evolution and missing columns) with its rows counted; any other format through pyiceberg's
private generator ``_task_to_record_batches``. They yield the same batches; the direct path only skips pyiceberg's
per-batch re-projection and its small default batch size. Every Parquet read is held to the rows the footer and
the manifest entry state, row group by row group (:mod:`sqe.execution.file_rows`). A direct read of a
range-cached file goes through the decoded-column cache (:mod:`sqe.execution.decoded_cache`, ``[cache]
decoded_bytes``): each row group's kept columns are reused, only missing ones are decoded (by the same two
readers), and the filter runs on the assembled rows, so a repeat scan pays no Parquet decode.

At most ``max_files_in_flight`` files are open and at most ``max_queued_batches`` batches wait in the queue, so
memory stays bounded whatever the table size. The consumer polls a cancel event, so an interrupted query stops
within one poll interval even when no batch comes.
"""

from __future__ import annotations

import inspect
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pyiceberg
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.expressions.visitors import bind, extract_field_ids, translate_column_names
from pyiceberg.io import pyarrow as _pyiceberg_arrow
from pyiceberg.io.pyarrow import expression_to_pyarrow, pyarrow_to_schema, schema_to_pyarrow
from pyiceberg.manifest import FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table.deletion_vector import deletion_vectors_from_puffin_file
from pyiceberg.table.puffin import PuffinFile
from pyiceberg.types import BinaryType, IcebergType, StringType

from sqe._counters import Counters
from sqe.errors import QueryError
from sqe.execution import nested_nulls  # noqa: F401  # pyiceberg's projection keeps NULL lists/maps of structs
from sqe.execution.cache import parquet_fragment
from sqe.execution.cached_files import (
    CACHED_RANGE_FS,
    cached_file_key,
    kept_whole,
    prefetched,
    stopping_prefetches,
)
from sqe.execution.decoded_cache import DECODED
from sqe.execution.delete_limits import VectorEntry, check_position_deletes, record_counts, task_vector_entries
from sqe.execution.file_rows import (
    check_file_rows,
    check_group_rows,
    check_orc_file_rows,
    filtered,
    group_batches,
    scan_columns,
)
from sqe.execution.projected_read import PARQUET, parquet_task_batches
from sqe.execution.row_filter import RowMask, compile_row_filter, filter_rows
from sqe.planning.read_filters import narrowed_fields, narrowed_filter

if TYPE_CHECKING:
    import pyarrow.compute as pc
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.table import FileScanTask

    from sqe.execution.byte_cache import FileKey
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
_pyiceberg_task_batches: Callable[..., Iterator[pa.RecordBatch]] = _pyiceberg_arrow._task_to_record_batches
_read_deletes: Callable[..., dict[str, pa.ChunkedArray]] = _pyiceberg_arrow._read_deletes

DEFAULT_TARGET_BATCH_BYTES = 8 << 20
_MIN_BATCH_ROWS = 8_192
_MAX_BATCH_ROWS = 1 << 20
# pyarrow's Fragment.open() opens by path, which costs an object store a HEAD; the scanner opens with the manifest's
# size. Opening by path is free on a local file system and on the range-cached one (pyarrow names a Python file
# system "py::" + its handler's type name), which opens upstream only on a miss.
_LOCAL_FS = "local"
_RANGE_CACHED_FS = f"py::{CACHED_RANGE_FS}"
# A row group is decoded whole into the decoded-column cache only while its estimated decoded size is at most this
# fraction of the cache's bound; a larger one streams batch by batch as without the cache.
_DECODED_GROUP_SHARE = 8
# Arrow types pyiceberg hands through unchanged although its own mapping of the Iceberg type is the large one.
_PASS_THROUGH: dict[type[IcebergType], tuple[pa.DataType, ...]] = {
    StringType: (pa.string(), pa.large_string()),
    BinaryType: (pa.binary(), pa.large_binary()),
}


def _task_to_record_batches(
    read: ReadSpec,
    task: FileScanTask,
    positional_deletes: list[pa.ChunkedArray] | None,
    *,
    target_batch_bytes: int = DEFAULT_TARGET_BATCH_BYTES,
    parallel_decode: bool = True,
    projections: ProjectionMemo | None = None,
    prefetch: bool = False,
) -> Iterator[pa.RecordBatch]:
    """The batches of one file task: the direct pyarrow scan when it is exact, else pyiceberg's reader.

    ``parallel_decode`` decodes a file's columns on pyarrow's thread pool; when enough files are read at once to
    keep every core busy, decoding each in its reader thread saves the pool's hand-offs. ``projections`` keeps
    the direct projections of one scan (same ReadSpec) by file schema: the files of a table mostly share one.
    ``prefetch``: the direct scan of a file read range by range fetches its column chunks in parallel
    (:func:`sqe.execution.cached_files.prefetched`; ``[cache] prefetch``); on or off, its reads close together
    are fetched as one."""
    fragment: ds.ParquetFileFragment | None = None
    if not positional_deletes and task.file.file_format == FileFormat.PARQUET:
        # The table's FileIO: per-file credentials; the manifest's size: no HEAD; a kept footer: no footer GET.
        fragment = parquet_fragment(read.io, task.file.file_path, task.file.file_size_in_bytes, PARQUET)
        direct = _projection_for(read, fragment.physical_schema, projections)
        if direct is not None:
            check_file_rows(fragment.metadata, task.file.record_count)
            size = task.file.file_size_in_bytes
            yield from direct.batches(
                fragment, target_batch_bytes, parallel_decode=parallel_decode, file_size=size, prefetch=prefetch
            )
            return
    if read.promoted_filter_ids:
        yield from _promoted_then_filtered(read, task, positional_deletes, fragment)
        return
    yield from _pyiceberg_batches(
        read, task, positional_deletes, read.bound_row_filter, read.projected_schema, fragment
    )


def _pyiceberg_batches(
    read: ReadSpec,
    task: FileScanTask,
    positional_deletes: list[pa.ChunkedArray] | None,
    row_filter: BooleanExpression,
    projected: Schema,
    fragment: ds.ParquetFileFragment | None = None,
) -> Iterator[pa.RecordBatch]:
    """pyiceberg's reader of the file; a Parquet file's (``fragment``: when already opened) with its rows counted
    (:mod:`sqe.execution.projected_read`), an ORC file's once its footer agrees with its manifest entry."""
    arguments = (
        read.io,
        task,
        row_filter,
        projected,
        read.table_schema,
        set(read.projected_field_ids),
        positional_deletes,
        read.case_sensitive,
        read.name_mapping,
        read.specs.get(task.file.spec_id),
        read.format_version,
    )
    if task.file.file_format == FileFormat.PARQUET:
        return parquet_task_batches(*arguments, fragment=fragment)
    if task.file.file_format == FileFormat.ORC:
        check_orc_file_rows(read.io, task.file.file_path, task.file.record_count)
    return _pyiceberg_task_batches(*arguments)


def _promoted_then_filtered(
    read: ReadSpec,
    task: FileScanTask,
    positional_deletes: list[pa.ChunkedArray] | None,
    fragment: ds.ParquetFileFragment | None,
) -> Iterator[pa.RecordBatch]:
    """A file of a table whose filter reads a promoted column. pyiceberg binds the filter to the file's own types,
    so ``x > 0.1`` on a file written while ``x`` was a float compares with 0.1 rounded to a float (0.1f > 0.1f:
    the row is dropped). Iceberg's rule (the Java reader) compares the promoted value with the table's literal
    (0.1f as a double is above 0.1): the file is read in the table's types, then filtered exactly.

    ``fragment`` (a Parquet file without positional deletes, its footer loaded) is read with the filter narrowed
    to its own types (``sqe.planning.read_filters``: never stronger than the exact one), so its row groups are
    pruned by their statistics as any other file's; one whose row groups all fail it is not opened at all."""
    extra = [
        read.table_schema.find_field(field_id)
        for field_id in sorted(extract_field_ids(read.bound_row_filter))
        if field_id not in read.projected_schema.field_ids
    ]
    names = {f.name.lower() for f in read.projected_schema.fields}
    if any(f.name.lower() in names for f in extra):
        raise QueryError("cannot filter a promoted column whose name an older column of the scan holds")
    widened = Schema(*read.projected_schema.fields, *extra) if extra else read.projected_schema
    translated = translate_column_names(read.bound_row_filter, widened, case_sensitive=read.case_sensitive)
    condition = expression_to_pyarrow(bind(widened, translated, case_sensitive=read.case_sensitive), widened)
    kept = [f.name for f in read.projected_schema.fields]
    file_schema = _file_schema(read, fragment.physical_schema) if fragment is not None else None
    # Without the file's schema (no fragment: positional deletes or not Parquet) the file is read unfiltered.
    pushed = _narrowed_file_filter(read, file_schema) if file_schema is not None else AlwaysTrue()
    if (
        fragment is not None
        and file_schema is not None
        and not _row_groups_may_match(read, fragment, file_schema, pushed)
    ):
        return
    for batch in _pyiceberg_batches(read, task, positional_deletes, pushed, widened, fragment):
        filtered = pa.Table.from_batches([batch]).filter(condition).select(kept)
        yield from filtered.to_batches()


def _narrowed_file_filter(read: ReadSpec, file_schema: Schema) -> BooleanExpression:
    """The row filter, bound to the table's schema, with its leaves on columns this file holds in a narrower
    type narrowed to that type."""
    narrowed = narrowed_fields(read.bound_row_filter, read.table_schema, file_schema)
    return narrowed_filter(read.bound_row_filter, narrowed)


def _row_groups_may_match(
    read: ReadSpec, fragment: ds.ParquetFileFragment, file_schema: Schema, pushed: BooleanExpression
) -> bool:
    """Whether any row group of the file may hold a row ``pushed`` keeps, by the groups' statistics. Only asked
    when the file holds every column the filter reads, at the top level: pyiceberg fills a column a file lacks
    from its partition or default value, which the statistics know nothing of (then: it may)."""
    if isinstance(pushed, AlwaysTrue):
        return True
    top_level = {field.field_id for field in file_schema.fields}
    if not extract_field_ids(pushed) <= top_level:
        return True
    translated = translate_column_names(pushed, file_schema, case_sensitive=read.case_sensitive)
    condition = expression_to_pyarrow(bind(file_schema, translated, case_sensitive=read.case_sensitive), file_schema)
    kept = fragment.subset(filter=condition, schema=fragment.physical_schema)
    return kept is None or bool(kept.row_groups)


def _file_schema(read: ReadSpec, physical_schema: pa.Schema) -> Schema | None:
    """The Iceberg schema of a Parquet file as pyiceberg reads it, or None (no field ids and no name mapping)."""
    try:
        return pyarrow_to_schema(
            physical_schema,
            read.name_mapping,
            downcast_ns_timestamp_to_us=read.format_version <= 2,
            format_version=read.format_version,  # type: ignore[arg-type]  # a TableVersion, read from metadata
        )
    except ValueError:
        return None


class ProjectionMemo:
    """The direct projections of one scan (same ReadSpec) by file schema: the files of a table mostly share one.

    Schemas match only with equal field metadata (the Parquet field ids), which ``pa.Schema ==`` ignores; comparing
    them so costs far less per file than serialising each file's schema into a key. At most ``MAX_SCHEMAS`` are
    kept (a table's files rarely have more than a few), so a lookup stays a short scan."""

    MAX_SCHEMAS = 32

    def __init__(self) -> None:
        self._entries: list[tuple[pa.Schema, DirectProjection | None]] = []

    def __len__(self) -> int:
        return len(self._entries)

    def projection(self, read: ReadSpec, physical_schema: pa.Schema) -> DirectProjection | None:
        for schema, projection in self._entries:  # readers only ever append, so iterating needs no lock
            if schema.equals(physical_schema, check_metadata=True):
                return projection
        projection = direct_projection(read, physical_schema)
        if len(self._entries) < self.MAX_SCHEMAS:  # two readers may both add one schema: same result, no harm
            self._entries.append((physical_schema, projection))
        return projection


def _projection_for(read: ReadSpec, physical_schema: pa.Schema, memo: ProjectionMemo | None) -> DirectProjection | None:
    return direct_projection(read, physical_schema) if memo is None else memo.projection(read, physical_schema)


@dataclass(frozen=True)
class DirectProjection:
    """How to scan one Parquet file so its batches equal pyiceberg's, without re-projecting every batch."""

    file_columns: tuple[str, ...]  # physical names, in projected-schema order
    schema: pa.Schema  # what pyiceberg's projection would produce: Iceberg names, file types, no field ids
    arrow_filter: pc.Expression | None
    # Physical top-level columns the filter reads besides file_columns; None: it reads one that is not top-level
    # (then the decoded-column cache is not used for the file).
    filter_columns: tuple[str, ...] | None = ()
    # The same filter as direct compute calls, for the row groups the decoded-column cache assembles (one Acero
    # plan per group costs about twice as much); None: those groups are filtered with arrow_filter.
    row_mask: RowMask | None = None

    def batches(
        self,
        fragment: ds.ParquetFileFragment,
        target_batch_bytes: int,
        *,
        parallel_decode: bool = True,
        file_size: int = 0,
        prefetch: bool = False,
    ) -> Iterator[pa.RecordBatch]:
        """``file_size``: the manifest's size of the file (0: unknown), which tells whether it is kept whole.
        ``prefetch``: a file the scanner reads range by range has its column chunks fetched in parallel (on or
        off, its reads close together are fetched as one)."""
        rows = batch_rows(fragment, self.file_columns, target_batch_bytes)
        cached = self._decoded_cache_key(fragment)
        if cached is not None:
            whole = kept_whole(file_size)  # in memory: the Parquet reader; else the scanner
            yield from self._cached_batches(fragment, cached, rows, parallel_decode, whole, prefetch)
            return
        if self.reads_plainly(fragment, file_size):
            yield from self._read_batches(fragment, rows, parallel_decode)
            return
        yield from self._scanned_batches(fragment, rows, prefetch)

    def _scanned_batches(self, fragment: ds.ParquetFileFragment, rows: int, prefetch: bool) -> Iterator[pa.RecordBatch]:
        """The file's batches by the dataset scanner over the row groups the filter's statistics keep, each
        group's rows counted before the filter (which the scanner evaluates as a column) drops any."""
        columns, mask = scan_columns(self.file_columns, self.arrow_filter, fragment.physical_schema)
        groups = self._row_groups(fragment)
        batches = group_batches(fragment, groups, columns, rows)
        # The filter's columns too: the scanner reads them. Reads close together are fetched as one, and with the
        # prefetch on all are fetched in parallel before the scanner asks.
        batches = prefetched(fragment, groups, self._read_columns, batches, eager=prefetch)
        for _, batch in batches:
            kept = filtered(batch, mask, self.schema)
            if kept.num_rows:  # like pyiceberg: a filter may leave nothing of a batch
                yield kept

    def reads_plainly(self, fragment: ds.ParquetFileFragment, file_size: int) -> bool:
        """Whether pyarrow's Parquet reader reads the file (no row filter, opening it by path is free, and its reads
        stay native: a local file, or a range-cached one kept whole in memory). A range-cached file read range by
        range calls into Python for every read and is left to the scanner, which decodes row groups in parallel
        (the reader decodes them one after another) and measured cheaper on such files."""
        if self.arrow_filter is not None:
            return False
        if fragment.filesystem is None:  # a buffer in memory (a FileIO that is not pyarrow's)
            return True
        kind = fragment.filesystem.type_name
        return kind == _LOCAL_FS or (kind == _RANGE_CACHED_FS and kept_whole(file_size))

    def _decoded_cache_key(self, fragment: ds.ParquetFileFragment) -> FileKey | None:
        """The range-cache key of the fragment when its row groups go through the decoded-column cache: the cache
        is on, the fragment reads through the range cache (so the catalog vended its credential set in this
        query), the filter reads top-level columns only, and no row group is too large to keep."""
        if not DECODED.enabled or self.filter_columns is None or not self._read_columns:
            return None  # (no column at all: a row count, which the other paths read without decoding)
        key = cached_file_key(fragment)
        if key is None:
            return None
        metadata = fragment.metadata
        row_bytes = decoded_row_bytes(fragment, self._read_columns)
        largest = max((metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)), default=0)
        return key if largest * row_bytes <= DECODED.max_bytes // _DECODED_GROUP_SHARE else None

    @property
    def _read_columns(self) -> tuple[str, ...]:
        return self.file_columns + (self.filter_columns or ())

    def _cached_batches(
        self, fragment: ds.ParquetFileFragment, key: FileKey, rows: int, threads: bool, whole: bool, prefetch: bool
    ) -> Iterator[pa.RecordBatch]:
        """The file's batches assembled from decoded columns, decoding (and keeping) only the missing ones.

        Row groups go in file order, pruned by the filter through their statistics as the scanner prunes them;
        the filter then runs on each assembled piece, so the rows are the scanner's rows. Like the other paths, a
        batch never spans two row groups and holds at most ``rows`` rows. Missing columns stream in pieces of at
        most ``rows`` rows (so consuming overlaps decoding, as without the cache) and are kept once their group is
        complete, unless they decode to more than the group's share of the bound. ``whole``: the file is kept whole
        in the range cache, so they are decoded by the Parquet reader over the in-memory file; otherwise by the
        dataset scanner, which decodes row groups in parallel. A group's kept columns are taken only when it is
        due (one evicted meanwhile is decoded again), so the scan never holds later groups' columns alive."""
        metadata = fragment.metadata
        wanted = self._read_columns
        groups = [i for i in self._row_groups(fragment) if metadata.row_group(i).num_rows]
        # Only the names of what is kept: holding the columns of every later group would keep them alive past an
        # eviction (over the bound); each group's are taken when it is due.
        found = {index: set(DECODED.columns(key, index, wanted)) for index in groups}
        incomplete = [index for index in groups if len(found[index]) < len(wanted)]
        missing = [name for name in wanted if any(name not in found[index] for index in incomplete)]
        decode: _Decoder = _decode_whole if whole else partial(_decode_by_scanner, prefetch=prefetch)
        share = DECODED.max_bytes // _DECODED_GROUP_SHARE
        pieces = decode(fragment, incomplete, missing, rows, threads) if incomplete else iter(())
        put: list[tuple[int, str]] = []  # what this read kept, dropped again if the file is refused
        try:
            for index in groups:
                names = [name for name in wanted if name not in missing] if index in incomplete else list(wanted)
                kept = _kept_columns(fragment, key, index, names, rows, threads, decode)
                if index not in incomplete:
                    yield from self._piece_batches(kept, rows)
                else:
                    yield from self._decoding_group(key, index, kept, missing, pieces, rows, share, put)
        except QueryError:  # a row group that yielded other rows than it states: nothing of this file stays kept
            DECODED.drop_columns(key, put)
            raise
        finally:
            close = getattr(pieces, "close", None)
            if close is not None:  # stops the decoder (and closes its file) when the consumer leaves early
                close()

    def _decoding_group(
        self,
        key: FileKey,
        index: int,
        kept: dict[str, pa.ChunkedArray],
        missing: list[str],
        pieces: Iterator[_Piece],
        rows: int,
        share: int,
        put: list[tuple[int, str]],
    ) -> Iterator[pa.RecordBatch]:
        """One row group's batches: its ``kept`` columns with the ``missing`` ones as they are decoded, which are
        kept once the group is complete unless they decoded to more than ``share`` bytes (listed in ``put``)."""
        chunks: dict[str, list[pa.Array]] | None = {name: [] for name in missing}
        held, seen = 0, set[int]()
        last = False
        while not last:
            piece_index, offset, piece, last = next(pieces)
            if piece_index != index:  # both walk the same groups in file order; never mix two groups
                raise QueryError(f"decoded row group {piece_index} where {index} was due")
            view = {name: column.slice(offset, piece.num_rows) for name, column in kept.items()}
            for name in missing:
                view[name] = piece.column(name)
            held += _new_buffer_bytes(piece, seen)  # pieces may be slices of one decoded buffer
            # The size check before decoding estimates from the first group's encoded sizes only (a
            # dictionary-encoded or skewed column decodes far larger): a group found over its share once decoded
            # is not kept, and its pieces are let go as without the cache.
            if held > share:
                chunks = None
            if chunks is not None:
                for name in missing:
                    chunks[name].extend(piece.column(name).chunks)
            yield from self._piece_batches(view, rows)
        for name, decoded in (chunks or {}).items():
            if DECODED.put_column(key, index, name, pa.chunked_array(decoded, piece.schema.field(name).type)):
                put.append((index, name))

    def _piece_batches(self, columns: dict[str, pa.ChunkedArray], rows: int) -> Iterator[pa.RecordBatch]:
        """Batches of consecutive rows of one row group, filtered, with the projection's schema."""
        wanted = self._read_columns
        group = pa.Table.from_arrays([columns[name] for name in wanted], names=list(wanted))
        if self.row_mask is not None:
            group = filter_rows(group, self.row_mask).select(list(self.file_columns))
        elif self.arrow_filter is not None:
            group = group.filter(self.arrow_filter).select(list(self.file_columns))
        for batch in group.to_batches(max_chunksize=rows):
            if batch.num_rows:
                yield pa.RecordBatch.from_arrays(batch.columns, schema=self.schema)

    def _row_groups(self, fragment: ds.ParquetFileFragment) -> list[int]:
        """Every row group's index, or with a filter those its statistics do not rule out (the scanner's rule)."""
        if self.arrow_filter is None:
            return list(range(fragment.metadata.num_row_groups))
        kept = fragment.subset(filter=self.arrow_filter, schema=fragment.physical_schema)
        return sorted(group.id for group in kept.row_groups)

    def _read_batches(self, fragment: ds.ParquetFileFragment, rows: int, threads: bool) -> Iterator[pa.RecordBatch]:
        """Every row of the file, read with its kept footer by pyarrow's Parquet reader. Without a filter the
        dataset scanner only adds per-file cost (an execution plan, its threads and generators), which is most
        of a small file's time; the reader decodes the same columns into the same values, and like the scanner
        it never joins row groups into one batch."""
        metadata = fragment.metadata
        columns = list(self.file_columns)
        # Called only where opening by path sends no request. The options are the scanner's (PARQUET's).
        with fragment.open() as source:
            parquet = pq.ParquetFile(
                source, metadata=metadata, pre_buffer=True, buffer_size=0, arrow_extensions_enabled=False
            )
            for index in range(metadata.num_row_groups):
                group_rows = metadata.row_group(index).num_rows
                if group_rows == 0:
                    continue
                if group_rows <= rows:  # one batch: read the group whole
                    batches: Iterator[pa.RecordBatch] | list[pa.RecordBatch] = parquet.read_row_group(
                        index, columns=columns, use_threads=threads
                    ).to_batches()
                else:  # decoded batch by batch, so a large group never sits in memory whole
                    batches = parquet.iter_batches(
                        batch_size=rows, row_groups=[index], columns=columns, use_threads=threads
                    )
                read_rows = 0
                for batch in batches:
                    read_rows += batch.num_rows
                    check_group_rows(index, group_rows, read_rows, done=False)
                    if batch.num_rows:
                        yield pa.RecordBatch.from_arrays(batch.columns, schema=self.schema)
                check_group_rows(index, group_rows, read_rows, done=True)


# A piece of a row group's missing columns: (row group, offset of its first row, the piece, whether it is the last).
_Piece = tuple[int, int, pa.Table, bool]
_Decoder = Callable[[ds.ParquetFileFragment, list[int], list[str], int, bool], Iterator[_Piece]]


def _new_buffer_bytes(piece: pa.Table, seen: set[int]) -> int:
    """Bytes of the piece's buffers not in ``seen`` (addresses, updated): the memory it adds to its group. A reader
    may decode a column chunk whole and slice its batches from it, so each piece's own total would count the
    chunk's buffers once per piece."""
    added = 0
    for column in piece.columns:
        for chunk in column.chunks:
            for buffer in chunk.buffers():
                if buffer is not None and buffer.address not in seen:
                    seen.add(buffer.address)
                    added += buffer.size
    return added


def _kept_columns(
    fragment: ds.ParquetFileFragment,
    key: FileKey,
    index: int,
    names: list[str],
    rows: int,
    threads: bool,
    decode: _Decoder,
) -> dict[str, pa.ChunkedArray]:
    """The kept ``names`` of one row group; any evicted since the scan looked them up are decoded again (and not
    kept: the scan that evicted them needed the room)."""
    rows_in_group = fragment.metadata.row_group(index).num_rows
    kept = {
        name: column
        for name, column in DECODED.columns(key, index, names, counted=False).items()
        if len(column) == rows_in_group and column.type == fragment.physical_schema.field(name).type
    }  # (one that does not fit the footer would be another content under the same path and size: not served)
    gone = [name for name in names if name not in kept]
    if gone:
        DECODED.stats.add(misses=len(gone))  # counted as misses, so a repeat scan that decodes shows it
        pieces = [piece for _, _, piece, _ in decode(fragment, [index], gone, rows, threads)]
        decoded = pa.concat_tables(pieces)
        kept.update({name: decoded.column(name) for name in gone})
    return kept


def _decode_whole(
    fragment: ds.ParquetFileFragment, groups: list[int], columns: list[str], rows: int, threads: bool
) -> Iterator[_Piece]:
    """Each row group's ``columns``, decoded by pyarrow's Parquet reader (a file in memory: native reads): a group
    of at most ``rows`` rows whole, a larger one batch by batch, as :meth:`DirectProjection._read_batches`."""
    metadata = fragment.metadata
    with fragment.open() as source:  # opening by path is free on the range-cached file system
        parquet = pq.ParquetFile(
            source, metadata=metadata, pre_buffer=True, buffer_size=0, arrow_extensions_enabled=False
        )
        for index in groups:
            group_rows = metadata.row_group(index).num_rows
            if group_rows <= rows:
                whole = parquet.read_row_group(index, columns=columns, use_threads=threads)
                check_group_rows(index, group_rows, whole.num_rows, done=True)
                yield index, 0, whole, True
                continue
            offset = 0
            for batch in parquet.iter_batches(
                batch_size=rows, row_groups=[index], columns=columns, use_threads=threads
            ):
                check_group_rows(index, group_rows, offset + batch.num_rows, done=False)
                yield index, offset, pa.Table.from_batches([batch]), offset + batch.num_rows == group_rows
                offset += batch.num_rows
            check_group_rows(index, group_rows, offset, done=True)


def _decode_by_scanner(
    fragment: ds.ParquetFileFragment,
    groups: list[int],
    columns: list[str],
    rows: int,
    _threads: bool,
    *,
    prefetch: bool = False,
) -> Iterator[_Piece]:
    """Each row group's ``columns``, decoded by the dataset scanner over just those groups (in parallel, in file
    order) in batches of at most ``rows`` rows. Each batch is known to be of its group (:func:`group_batches`),
    and a group's last piece comes only once it yielded exactly the rows it states: a group whose pages hold
    fewer is refused, never completed (and kept) with the next group's rows. Reads close together are fetched as
    one; ``prefetch``: the groups' column chunks of ``columns`` are fetched in parallel meanwhile."""
    metadata = fragment.metadata
    index, offset = -1, 0
    batches = prefetched(fragment, groups, columns, group_batches(fragment, groups, columns, rows), eager=prefetch)
    for group, batch in batches:
        offset = offset if group == index else 0
        index, end = group, offset + batch.num_rows
        yield group, offset, pa.Table.from_batches([batch]), end == metadata.row_group(group).num_rows
        offset = end


def direct_projection(read: ReadSpec, physical_schema: pa.Schema) -> DirectProjection | None:
    """The direct scan of a file with this schema, or None when pyiceberg's projection would change anything
    (renamed-only columns are fine; missing, promoted, re-typed or nested columns are not)."""
    file_schema = _file_schema(read, physical_schema)
    if file_schema is None:  # no field ids and no name mapping: pyiceberg reports it
        return None
    if _holds_promoted_filter_column(read, file_schema):
        return None  # filtered after promotion (_promoted_then_filtered)
    columns: list[str] = []
    fields: list[pa.Field] = []
    for wanted in read.projected_schema.columns:
        if not wanted.field_type.is_primitive or wanted.field_id not in file_schema.field_ids:
            return None
        in_file = file_schema.find_field(wanted.field_id)
        index = physical_schema.get_field_index(in_file.name)
        if in_file.field_type != wanted.field_type or index < 0:
            return None
        arrow_type = physical_schema.field(index).type
        if not _passes_through(wanted.field_type, arrow_type):
            return None
        columns.append(in_file.name)
        metadata = {b"doc": wanted.doc.encode()} if wanted.doc else None
        fields.append(pa.field(wanted.name, arrow_type, nullable=wanted.optional, metadata=metadata))
    bound_filter = _file_filter(read, file_schema)
    if bound_filter is None:
        return DirectProjection(tuple(columns), pa.schema(fields), None)
    return DirectProjection(
        tuple(columns),
        pa.schema(fields),
        expression_to_pyarrow(bound_filter, file_schema),
        _filter_columns(read, file_schema, physical_schema, columns),
        compile_row_filter(bound_filter, file_schema, physical_schema),
    )


def _holds_promoted_filter_column(read: ReadSpec, file_schema: Schema) -> bool:
    """Whether the file holds a column the row filter reads in a type narrower than the table's."""
    return any(
        field_id in file_schema.field_ids and file_schema.find_type(field_id) != read.table_schema.find_type(field_id)
        for field_id in read.promoted_filter_ids
    )


def _filter_columns(
    read: ReadSpec, file_schema: Schema, physical_schema: pa.Schema, projected: list[str]
) -> tuple[str, ...] | None:
    """The file's top-level columns the row filter reads beyond ``projected`` (None: it reads a nested one). A
    field the file lacks is not read: the translated filter treats it as all nulls."""
    extra: list[str] = []
    for field_id in sorted(extract_field_ids(read.bound_row_filter)):
        name = file_schema.find_column_name(field_id) if field_id in file_schema.field_ids else None
        if name is None:
            continue
        index = physical_schema.get_field_index(name)
        if index < 0 or pa.types.is_nested(physical_schema.field(index).type):
            return None
        if name not in projected and name not in extra:
            extra.append(name)
    return tuple(extra)


def _passes_through(iceberg_type: IcebergType, arrow_type: pa.DataType) -> bool:
    if arrow_type in _PASS_THROUGH.get(type(iceberg_type), ()):
        return True
    return bool(arrow_type == schema_to_pyarrow(iceberg_type, include_field_ids=False))


def _file_filter(read: ReadSpec, file_schema: Schema) -> BooleanExpression | None:
    """The row filter bound to the file's own column names (the table's may have been renamed since)."""
    if isinstance(read.bound_row_filter, AlwaysTrue):
        return None
    translated = translate_column_names(read.bound_row_filter, file_schema, case_sensitive=read.case_sensitive)
    return bind(file_schema, translated, case_sensitive=read.case_sensitive)


def batch_rows(fragment: ds.ParquetFileFragment, columns: tuple[str, ...], target_batch_bytes: int) -> int:
    """Rows per batch so a batch of these columns holds about ``target_batch_bytes`` once decoded: few large
    batches keep the per-batch Python work (queue, transform, DuckDB's pull) small against the data."""
    row_bytes = decoded_row_bytes(fragment, columns)
    if row_bytes == 0:
        return _MAX_BATCH_ROWS
    return max(_MIN_BATCH_ROWS, min(_MAX_BATCH_ROWS, int(target_batch_bytes / max(row_bytes, 1.0))))


def decoded_row_bytes(fragment: ds.ParquetFileFragment, columns: tuple[str, ...]) -> float:
    """About how many bytes a row of these columns takes once decoded, from the first row group (0: no rows)."""
    metadata = fragment.metadata
    if metadata.num_row_groups == 0 or metadata.row_group(0).num_rows == 0:
        return 0.0
    group = metadata.row_group(0)
    encoded = {
        group.column(i).path_in_schema: group.column(i).total_uncompressed_size for i in range(group.num_columns)
    }
    row_bytes = 0.0
    for name in columns:
        arrow_type = fragment.physical_schema.field(name).type
        try:
            row_bytes += arrow_type.bit_width / 8
        except ValueError:  # variable width: encoded bytes per row, plus an offset
            row_bytes += encoded.get(name, 0) / group.num_rows + 4
    return row_bytes


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
class ScanMetrics(Counters):
    """Counters of one or more scans, safe to read from another thread (progress bars, tests)."""

    files_total: int = 0  # data files planned
    files_done: int = 0
    bytes_done: int = 0  # data-file bytes read (the sizes the manifests give)
    rows_produced: int = 0
    batches_produced: int = 0
    batches_in_flight: int = 0  # produced by a reader thread, not yet handed to the consumer
    max_batches_in_flight: int = 0
    max_files_in_flight: int = 0
    files_open: int = 0  # opened by a reader thread, not yet read to the end
    scans_opened: int = 0

    def _after_add(self) -> None:
        # High-water marks, updated under the same lock as the counters they follow.
        self.max_batches_in_flight = max(self.max_batches_in_flight, self.batches_in_flight)
        self.max_files_in_flight = max(self.max_files_in_flight, self.files_open)


@dataclass(frozen=True)
class _Done:
    pass


@dataclass(frozen=True)
class _Failed:
    error: BaseException


_DONE = _Done()


class LocalExecutor:
    def __init__(
        self,
        *,
        max_files_in_flight: int = 4,
        max_queued_batches: int = 8,
        poll_seconds: float = 0.05,
        target_batch_bytes: int = DEFAULT_TARGET_BATCH_BYTES,
        prefetch: bool = False,
    ):
        """Memory held by a scan is about (max_queued_batches + max_files_in_flight) x target_batch_bytes.
        ``prefetch``: fetch a range-cached file's column chunks in parallel (``[cache] prefetch``; off: each
        range is fetched when pyarrow asks for it, ranges close together as one)."""
        if max_files_in_flight < 1 or max_queued_batches < 1 or target_batch_bytes < 1:
            raise ValueError("max_files_in_flight, max_queued_batches and target_batch_bytes must be at least 1")
        self.max_files_in_flight = max_files_in_flight
        self.max_queued_batches = max_queued_batches
        self.poll_seconds = poll_seconds
        self.target_batch_bytes = target_batch_bytes
        self.prefetch = prefetch

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


@dataclass(eq=False, repr=False)  # a run is one pass of reader threads: identity, not value, equality
class _ScanRun:
    """One pass over a plan's tasks: reader threads feed a bounded queue, the caller's thread consumes it."""

    executor: LocalExecutor
    plan: FileScanSource
    cancel: threading.Event
    transform: BatchTransform | None
    metrics: ScanMetrics
    # Set by the consumer when it leaves, for any reason.
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _queue: queue.Queue[pa.RecordBatch | _Done | _Failed] = field(init=False)
    _tasks: Iterator[FileScanTask] = field(init=False)
    _tasks_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _deletes: _DeleteCache = field(init=False)
    _parallel_decode: bool = field(init=False)
    _projections: ProjectionMemo = field(default_factory=ProjectionMemo, init=False)

    def __post_init__(self) -> None:
        self._queue = queue.Queue(self.executor.max_queued_batches)
        self._tasks = iter(self.plan.tasks)
        self._deletes = _DeleteCache(self.plan)
        # Fewer files than cores: decode each file's columns in parallel too; otherwise the files keep the cores busy.
        self._parallel_decode = len(self.plan.tasks) < (pa.cpu_count() or 1)

    def batches(self) -> Iterator[pa.RecordBatch]:
        self._raise_if_cancelled()
        self.metrics.add(scans_opened=1, files_total=len(self.plan.tasks))
        workers = [
            threading.Thread(target=self._work, name=f"sqe-scan-{self.plan.ident}", daemon=True)
            for _ in range(min(self.executor.max_files_in_flight, len(self.plan.tasks)))
        ]
        for worker in workers:
            worker.start()
        try:
            yield from self._consume(len(workers))
        finally:
            self._stop.set()
            self._drain()
            for worker in workers:
                worker.join(timeout=self.executor.poll_seconds)

    def _consume(self, running: int) -> Iterator[pa.RecordBatch]:
        while running:
            self._raise_if_cancelled()
            try:
                item = self._queue.get(timeout=self.executor.poll_seconds)
            except queue.Empty:
                continue
            if isinstance(item, _Done):
                running -= 1
            elif isinstance(item, _Failed):
                raise item.error
            else:
                self.metrics.add(batches_in_flight=-1)
                yield item

    def _work(self) -> None:
        try:
            with stopping_prefetches(self._stop):  # a prefetch ends with the scan, not with its file's last read
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
        self.metrics.add(files_open=1)
        try:
            batches = _task_to_record_batches(
                self.plan.read,
                task,
                self._deletes.for_file(task),
                target_batch_bytes=self.executor.target_batch_bytes,
                parallel_decode=self._parallel_decode,
                projections=self._projections,
                prefetch=self.executor.prefetch,
            )
            for batch in batches:
                if self._stop.is_set():
                    return
                out = self.transform(batch) if self.transform is not None else batch
                if out.num_rows == 0:
                    # Nothing to hand on; and counted (EXPLAIN ANALYZE's scan_batches), a batch the row filter
                    # emptied would tell whether hidden rows matched the user's own predicates.
                    continue
                self.metrics.add(batches_in_flight=1, batches_produced=1, rows_produced=out.num_rows)
                if not self._put(out):
                    self.metrics.add(batches_in_flight=-1)
                    return
        finally:
            self.metrics.add(files_open=-1)
        self.metrics.add(files_done=1, bytes_done=task.file.file_size_in_bytes)

    def _put(self, item: pa.RecordBatch | _Done | _Failed) -> bool:
        """Block while the queue is full; give up once the consumer has gone."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=self.executor.poll_seconds)
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
                self.metrics.add(batches_in_flight=-1)

    def _raise_if_cancelled(self) -> None:
        if self.cancel.is_set():
            raise QueryCancelledError()


def _vectors(puffin: bytes) -> dict[str, pa.ChunkedArray]:
    """The positions of each deletion vector of the Puffin file ``puffin``, as pyiceberg's ``_read_deletes``
    decodes them: from the bytes that were checked."""
    return {dv.referenced_data_file: dv.to_vector() for dv in deletion_vectors_from_puffin_file(PuffinFile(puffin))}


class _DeleteCache:
    """Positional delete files, each read once per scan run however many data files it covers."""

    def __init__(self, plan: FileScanSource) -> None:
        self._io = plan.read.io
        self._tasks = plan.tasks
        self._lock = threading.Lock()
        self._path_locks: dict[str, threading.Lock] = {}
        self._contents: dict[str, dict[str, Any]] = {}

    @cached_property
    def _rows(self) -> dict[str, int]:
        """A deletion vector names no row past its data file's count; built on the first delete file only (two
        threads may both build it: the same dict)."""
        return record_counts(self._tasks)

    @cached_property
    def _entries(self) -> dict[str, dict[str, VectorEntry]]:
        """What the scan's deletion vector entries state of their blobs (built as ``_rows`` is)."""
        return task_vector_entries(self._tasks)

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
                # read whole next: its footer first (a Puffin file's blobs: each held to its manifest entry)
                checked = check_position_deletes(self._io, delete_file, self._rows, self._entries)
                self._contents[path] = _read_deletes(self._io, delete_file) if checked is None else _vectors(checked)
            return self._contents[path]
