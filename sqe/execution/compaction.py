"""``OPTIMIZE ns.t [WHERE <partition predicate>] [WITH (target_file_size = N)]``: compaction of small files.

The coordinator plans the table's live data files (only partitions the WHERE names; it may reference identity
partition columns only), bin-packs files smaller than the target per partition, reads each bin with its
position/equality deletes applied, writes the rows back as new files through the table's scoped FileIO, and
commits ONE ``replace`` snapshot (inputs deleted, outputs added; pyiceberg has no rewrite API, so its snapshot
producer is driven with ``Operation.REPLACE``).

Where: with ``[coordinator] workers`` the bins are rewritten by the workers (``remote``, see
``sqe.distributed.coordinator.rewrite``) and only the commit happens here; without workers, locally.
Credentials: locally the table's own FileIO, i.e. the catalog's vended write credentials when the user holds
write access (or the ``[storage]`` pair in static mode); on workers the tickets carry what
``[coordinator] distributed_credentials`` allows (vended sets, pushed when refreshed; the static pair only under
``static``/``auto``).
Concurrency: a commit conflict reloads the table; if every input file is still live the same outputs are
committed on top (concurrent appends survive), otherwise the outputs are deleted and the compaction fails with
``CompactionConflictError``. A table with read-restrictions for the caller is refused (it would need raw rows).
"""

from __future__ import annotations

import copy
import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, Not, Or
from pyiceberg.expressions.parser import parse as parse_expression
from pyiceberg.io.pyarrow import _dataframe_to_data_files
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.snapshots import Operation, Summary
from pyiceberg.table.update.snapshot import _OverwriteFiles
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import EMPTY_DICT

from sqe._text import first_line
from sqe.catalog.errors import PYICEBERG_CATALOG_ERRORS, translate_error
from sqe.errors import CompactionConflictError, QueryError, SQEError
from sqe.execution import nested_nulls  # noqa: F401  # pyiceberg's projection keeps NULL lists/maps of structs
from sqe.execution.delete_limits import check_task_deletes
from sqe.execution.projected_read import rewrite_rows
from sqe.execution.write_target import WriteTable, writable_table
from sqe.planning.avro_limits import UNDECODABLE, UNDECODED, bounded_table
from sqe.planning.planner import restrictions_of

if TYPE_CHECKING:
    import duckdb
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import FileScanTask

    from sqe.catalog.base import LoadedTable, TableIdent, TableProvider
    from sqe.config import SQEConfig
    from sqe.planning.external_sql import Optimize

log = logging.getLogger(__name__)

DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024
_SMALL_FRACTION = 0.75  # files below 75% of the target are "small"
_MAX_COMMIT_ATTEMPTS = 4


# Rewrites the bins elsewhere (the session's workers) and returns the new, uncommitted files; on failure it has
# deleted whatever it wrote. ``sqe.distributed.coordinator.rewrite.rewrite_on_workers`` bound to an executor.
RemoteRewriter = Callable[["LoadedTable", list[list["FileScanTask"]], int], list["DataFile"]]


def optimize(
    statement: Optimize,
    config: SQEConfig | None,
    provider: TableProvider,
    resolve_name: Callable[[Sequence[str]], TableIdent],
    parser: duckdb.DuckDBPyConnection,
    remote: RemoteRewriter | None = None,
) -> pa.Table:
    del config, parser  # the rewrite uses the table's own FileIO or the workers' tickets; nothing else is needed
    ident = resolve_name(statement.parts)
    loaded = provider.load_table(ident, bypass_cache=True)
    _refuse_restricted(loaded)
    target = _target_size(statement.options)
    row_filter = _partition_filter(loaded.table, statement.where, ident)
    with _undecodable_refused(ident):
        bins = list(plan_bins(bounded_table(loaded.table, f"cannot plan OPTIMIZE of {ident}"), row_filter, target))
    if not bins:
        return _result(0, 0, None)
    table = writable_table(loaded)  # its paths checked before any rewrite, local or on workers
    outputs = remote(loaded, bins, target) if remote is not None else _rewrite_locally(ident, table, bins, target)
    inputs = [task for group in bins for task in group]
    try:
        snapshot_id = commit_replace(loaded, provider, inputs, outputs)
    finally:
        provider.invalidate(ident)  # as every write: committed or not, the table may have moved on meanwhile
    return _result(len(inputs), len(outputs), snapshot_id)


@contextmanager
def _undecodable_refused(ident: TableIdent, doing: str = "plan") -> Iterator[None]:
    """A manifest list or manifest that does not decode (or disagrees with its stated counts) as the scan's typed
    refusal: OPTIMIZE plans, and pyiceberg commits, with pyiceberg's own readers, outside the scan's translation."""
    try:
        yield
    except UNDECODABLE as exc:
        raise QueryError(f"cannot {doing} OPTIMIZE of {ident}: {UNDECODED}: {first_line(exc)}") from None


def _result(rewritten: int, added: int, snapshot_id: int | None) -> pa.Table:
    return pa.table(
        {
            "rewritten_files": pa.array([rewritten], pa.int64()),
            "added_files": pa.array([added], pa.int64()),
            "snapshot_id": pa.array([snapshot_id], pa.int64()),
        }
    )


def _refuse_restricted(loaded: LoadedTable) -> None:
    plan = restrictions_of(loaded)
    if plan.is_restricted:
        raise QueryError(
            f"OPTIMIZE is refused: {loaded.ident} has read-restrictions for you (rewriting needs raw rows)"
        )


def _target_size(options: dict[str, Any]) -> int:
    unknown = set(options) - {"target_file_size"}
    if unknown:
        raise QueryError(f"unknown OPTIMIZE option {sorted(unknown)[0]!r}")
    size = options.get("target_file_size", DEFAULT_TARGET_FILE_SIZE)
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise QueryError("OPTIMIZE target_file_size must be a positive number of bytes")
    return size


def _partition_filter(table: Table, where: str | None, ident: TableIdent) -> BooleanExpression:
    if where is None:
        return AlwaysTrue()
    try:
        expression = parse_expression(where)
    except Exception as exc:  # pyiceberg's parser raises ParseException subclasses of several kinds
        raise QueryError(f"OPTIMIZE {ident}: cannot parse WHERE {where!r}: {first_line(exc)}") from None
    schema = table.schema()
    spec = table.spec()
    allowed = {
        schema.find_field(f.source_id).name.lower() for f in spec.fields if isinstance(f.transform, IdentityTransform)
    }
    for name in _column_names(expression):
        if name.lower() not in allowed:
            raise QueryError(
                f"OPTIMIZE {ident}: WHERE may only name identity partition columns "
                f"({', '.join(sorted(allowed)) or 'the table is not partitioned'}); {name!r} is not one"
            )
    return expression


def _column_names(expression: BooleanExpression) -> Iterator[str]:
    if isinstance(expression, (And, Or)):
        yield from _column_names(expression.left)
        yield from _column_names(expression.right)
    elif isinstance(expression, Not):
        yield from _column_names(expression.child)
    else:
        term = getattr(expression, "term", None)
        name = getattr(term, "name", None)
        if isinstance(name, str):
            yield name


def plan_bins(table: Table, row_filter: BooleanExpression, target: int) -> Iterator[list[FileScanTask]]:
    """Per (spec, partition): small files packed into bins of at most ``target`` bytes; a bin is rewritten
    when it merges two or more files or applies deletes."""
    groups: dict[tuple[int, str], list[FileScanTask]] = {}
    for task in table.scan(row_filter=row_filter).plan_files():
        if task.file.file_size_in_bytes >= target * _SMALL_FRACTION and not task.delete_files:
            continue
        groups.setdefault((task.file.spec_id, repr(task.file.partition)), []).append(task)
    for tasks in groups.values():
        current: list[FileScanTask] = []
        size = 0
        for task in sorted(tasks, key=lambda t: t.file.file_path):
            if current and size + task.file.file_size_in_bytes > target:
                yield from _worth_rewriting(current)
                current, size = [], 0
            current.append(task)
            size += task.file.file_size_in_bytes
        yield from _worth_rewriting(current)


def _worth_rewriting(tasks: list[FileScanTask]) -> Iterator[list[FileScanTask]]:
    if len(tasks) > 1 or any(t.delete_files for t in tasks):
        yield tasks


def _rewrite_locally(
    ident: TableIdent, table: WriteTable, bins: list[list[FileScanTask]], target: int
) -> list[DataFile]:
    """Every bin rewritten here; if one fails, the files the earlier ones wrote are deleted (as on workers), and a
    storage or Arrow failure is a QueryError naming the table (as a scan's is)."""
    outputs: list[DataFile] = []
    try:
        for group in bins:
            outputs.extend(rewrite_bin(table, group, target))
    except SQEError:
        _delete_outputs(table, outputs)
        raise
    except Exception as exc:  # e.g. an object-store error: keep the table name, lose the traceback
        _delete_outputs(table, outputs)
        raise QueryError(f"OPTIMIZE of {ident} failed: {first_line(exc)}") from None
    except BaseException:
        _delete_outputs(table, outputs)
        raise
    return outputs


def rewrite_bin(table: WriteTable, tasks: list[FileScanTask], target: int) -> list[DataFile]:
    """Read the bin (deletes applied) and write it back as new data files; nothing is committed here."""
    metadata = table.metadata
    checked = check_task_deletes(table.files_io, tasks)  # each delete file is read whole
    rows = rewrite_rows(metadata, table.files_io, checked, tasks)  # each data file's rows counted
    if rows.num_rows == 0:
        return []
    properties = {**metadata.properties, "write.target-file-size-bytes": str(target)}
    sized = metadata.model_copy(update={"properties": properties})
    return list(_dataframe_to_data_files(sized, rows, table.files_io, write_uuid=uuid.uuid4()))


def commit_replace(
    loaded: LoadedTable, provider: TableProvider, inputs: Sequence[FileScanTask], outputs: list[DataFile]
) -> int | None:
    """One ``replace`` snapshot of ``outputs`` for the data files of ``inputs`` (the tasks the bins were read
    from, with the deletes applied then). On a conflict it is retried on the new table state only while every
    input is still live with exactly the deletes it was read with: a delete committed meanwhile against an input
    would otherwise be undone by outputs that still hold the deleted rows."""
    current, table = loaded, loaded.table
    for _attempt in range(_MAX_COMMIT_ATTEMPTS):
        try:
            table = writable_table(current)  # the paths of the state committed to are checked too
            with _undecodable_refused(loaded.ident, "commit"):  # pyiceberg's commit reads the current manifests
                return _commit_once(table, [task.file for task in inputs], outputs)
        except (CommitFailedException, ValidationException) as exc:
            log.info("OPTIMIZE %s: commit conflict (%s); re-checking the inputs", loaded.ident, type(exc).__name__)
            current = provider.load_table(loaded.ident, bypass_cache=True)
            table = current.table
            conflict = _checked_input_conflict(loaded.ident, table, inputs, outputs)
            if conflict:
                _delete_outputs(table, outputs)
                raise CompactionConflictError(
                    f"OPTIMIZE {loaded.ident} failed: {conflict}; its new files were deleted and nothing was committed"
                ) from None
        except SQEError:
            _delete_outputs(table, outputs)
            raise
        except PYICEBERG_CATALOG_ERRORS as exc:
            # It may have landed (a 5xx; or the transport sent it again and this answers the resend): files stay.
            raise translate_error(exc, f"OPTIMIZE commit to {loaded.ident}") from None
    _delete_outputs(table, outputs)
    raise CompactionConflictError(f"OPTIMIZE {loaded.ident} failed: the table kept changing during the commit")


class _ReplaceFiles(_OverwriteFiles):
    """pyiceberg's overwrite producer committing a ``replace`` snapshot (same files logic; pyiceberg's summary
    code knows only append/overwrite/delete, so the totals are computed as for an overwrite and relabelled)."""

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        self._operation = Operation.OVERWRITE
        try:
            summary = super()._summary(snapshot_properties)
        finally:
            self._operation = Operation.REPLACE
        return Summary(Operation.REPLACE, **summary.additional_properties)


def _commit_once(table: Table, inputs: list[DataFile], outputs: list[DataFile]) -> int | None:
    transaction = _without_internal_retries(table).transaction()
    producer = _ReplaceFiles(operation=Operation.REPLACE, transaction=transaction, io=table.io)
    for data_file in inputs:
        producer.delete_data_file(data_file)
    for data_file in outputs:
        producer.append_data_file(data_file)
    producer.commit()
    committed = transaction.commit_transaction()
    snapshot = committed.current_snapshot()
    return snapshot.snapshot_id if snapshot is not None else None


def _without_internal_retries(table: Table) -> Table:
    """``table`` whose commits pyiceberg does not retry by itself: every conflict must reach
    :func:`commit_replace`, whose re-check knows which deletes the outputs were written with (pyiceberg's own
    retry re-validated and let a concurrent position delete on an input through)."""
    properties = {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
    once = copy.copy(table)  # keeps its class: a WriteTable's location rules hold for this commit too
    once.metadata = table.metadata.model_copy(update={"properties": properties})
    return once


def _checked_input_conflict(
    ident: TableIdent, table: Table, inputs: Sequence[FileScanTask], outputs: list[DataFile]
) -> str | None:
    """:func:`_input_conflict` on the table's new state; a manifest of it that does not decode is refused, and
    the outputs deleted (raised in an ``except`` clause, it would pass the commit loop's own cleanup)."""
    try:
        with _undecodable_refused(ident):
            return _input_conflict(bounded_table(table, f"cannot plan OPTIMIZE of {ident}"), inputs)
    except SQEError:
        _delete_outputs(table, outputs)
        raise


def _input_conflict(table: Table, inputs: Sequence[FileScanTask]) -> str | None:
    """What a concurrent commit changed about the inputs, or None when each is live with the same deletes."""
    live = {task.file.file_path: _delete_paths(task) for task in table.scan().plan_files()}
    missing = [task.file.file_path for task in inputs if task.file.file_path not in live]
    if missing:
        return f"a concurrent commit removed {len(missing)} of its input files (e.g. {missing[0]})"
    changed = [task.file.file_path for task in inputs if live[task.file.file_path] != _delete_paths(task)]
    if changed:
        return f"a concurrent commit deleted rows from {len(changed)} of its input files (e.g. {changed[0]})"
    return None


def _delete_paths(task: FileScanTask) -> frozenset[str]:
    return frozenset(delete.file_path for delete in task.delete_files)


def _delete_outputs(table: Table, outputs: list[DataFile]) -> None:
    for data_file in outputs:
        try:
            table.io.delete(data_file.file_path)
        except Exception as exc:  # best effort; the file is unreferenced either way
            log.warning("OPTIMIZE: could not delete unreferenced output %s: %s", data_file.file_path, first_line(exc))
