"""Scan planning: which data and delete files a query reads, found by pyiceberg on a table whose FileIO is SQE's.

Read-restrictions travel with every plan: they are parsed (fail closed) from the raw load-table JSON, the scan
also reads the row filter's columns, and every batch goes through ``sqe.restrictions.apply`` (row filter on raw
values, then masks, then filter-only columns dropped) before anything else sees it.

Only safe predicates reach pyiceberg: the restrictions' required row filter (in a form never stronger than the
exact one) and user predicates on columns that are not masked. pyiceberg prunes partitions and files by
statistics with them and pushes them into the Parquet reader, so a predicate on a masked column would be tested
against raw values; the planner drops any user conjunct that touches a masked column, whoever passed it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyiceberg.exceptions import ResolveError
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, Not, Or
from pyiceberg.expressions.visitors import bind, extract_field_ids
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.manifest import ManifestContent
from pyiceberg.schema import Schema, promote
from pyiceberg.table import DataScan
from pyiceberg.types import ListType, MapType, NestedField, PrimitiveType, StructType

from sqe import vocabulary
from sqe._lru import LRUCache
from sqe._text import first_line, iso_utc
from sqe.errors import EncryptedTableError, QueryError, SQEError
from sqe.planning.absent_filter_fields import with_absent_filter_fields
from sqe.planning.avro_limits import UNDECODABLE, UNDECODED, ManifestBounds, bounded_io
from sqe.planning.filter_defaults import with_internal_defaults
from sqe.planning.manifests import plan_tasks
from sqe.planning.read_filters import nan_safe_filter
from sqe.restrictions import RestrictionPlan, apply, parse_restrictions, required_columns
from sqe.vocabulary import ENCRYPTION_KEY_ID, ENCRYPTION_KEYS

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.table import FileScanTask
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.table.name_mapping import NameMapping

    from sqe.catalog.base import LoadedTable, TableIdent
    from sqe.planning.remote import RemotePlanner

log = logging.getLogger(__name__)

if not isinstance(getattr(DataScan, "_manifest_planner", None), cached_property):  # private in 0.12; pinned <0.13
    raise ImportError("pyiceberg DataScan._manifest_planner is missing; SQE's planner supports pyiceberg 0.12")

ALWAYS_TRUE: BooleanExpression = AlwaysTrue()


BatchTransform = Callable[[pa.RecordBatch], pa.RecordBatch]


@dataclass(frozen=True)
class ReadSpec:
    """Everything a reader needs besides the file tasks; derived from the table metadata at planning time."""

    io: FileIO = field(repr=False)
    bound_row_filter: BooleanExpression
    projected_schema: Schema  # what is read: the output columns plus the restriction filter's columns
    table_schema: Schema
    projected_field_ids: frozenset[int]
    name_mapping: NameMapping | None
    specs: Mapping[int, PartitionSpec]
    format_version: int
    case_sensitive: bool = True
    # Fields the row filter reads that an older schema of the table held in a narrower type (int, float, a
    # smaller decimal): a file written then is filtered after its values are promoted (``sqe.execution.local``).
    promoted_filter_ids: frozenset[int] = frozenset()


@dataclass(frozen=True)
class ScanPlan:
    loaded: LoadedTable = field(repr=False)
    task_source: PlannedTasks = field(repr=False)
    read: ReadSpec = field(repr=False)
    restrictions: RestrictionPlan
    columns: tuple[str, ...]  # what the scan outputs, in schema order
    output_field_ids: frozenset[int]
    row_filter: BooleanExpression  # what pyiceberg prunes and filters with (unbound, by column name)
    user_filter: BooleanExpression  # the user's part of row_filter (EXPLAIN shows only this part)
    snapshot_id: int | None
    planned_at: float
    schema: Schema  # the schema the query reads (a time-travel read: the snapshot's), whose names it uses

    @property
    def ident(self) -> TableIdent:
        return self.loaded.ident

    @property
    def tasks(self) -> tuple[FileScanTask, ...]:
        """The file tasks; the manifests are read on first use (see :class:`PlannedTasks`)."""
        return self.task_source.get()

    def with_tasks(self, tasks: tuple[FileScanTask, ...]) -> ScanPlan:
        """The same plan over exactly ``tasks`` (e.g. one file of it)."""
        return dataclasses.replace(self, task_source=PlannedTasks.ready(tasks))

    @property
    def files_planned(self) -> int:
        return len(self.tasks)

    @property
    def bytes_planned(self) -> int:
        return sum(task.file.file_size_in_bytes for task in self.tasks)

    @property
    def delete_files(self) -> int:
        return len({d.file_path for task in self.tasks for d in task.delete_files})

    @property
    def records_planned(self) -> int:
        return sum(task.file.record_count for task in self.tasks)

    @property
    def output_schema(self) -> Schema:
        return self.read.projected_schema.select(*self.columns)

    @cached_property
    def arrow_schema(self) -> pa.Schema:
        """The batches' schema after restrictions: a masked column may hold NULLs whatever its type says.

        Worked out once per plan (a plan from the task cache serves many queries; the stream and the
        pass-through check each ask for it)."""
        return restricted_arrow_schema(self.read.projected_schema, self.output_field_ids, self.restrictions)

    def batch_transform(self, salt: bytes) -> BatchTransform | None:
        """The read-restrictions for one query (``salt``: its query-local salt), or None when there are none."""
        return restriction_transform(self.restrictions, self.read.projected_schema, self.output_field_ids, salt)

    def hides_rows(self) -> bool:
        """Whether a row filter hides rows: then counts of files and bytes read tell about the hidden ones."""
        return self.restrictions.row_filter is not None or self.restrictions.always_false

    def describe(self) -> dict[str, Any]:
        """One EXPLAIN row: what was planned and with which credentials. Never a secret."""
        loaded = self.loaded
        # Files, bytes and records planned after pruning (by the filter and by the user's own predicates) tell
        # which values hidden rows hold: a row-filtered table shows none of them (None = withheld).
        hidden = self.hides_rows()
        return {
            "table": str(loaded.ident),
            "snapshot_id": self.snapshot_id,
            "files_planned": None if hidden else self.files_planned,
            "bytes_planned": None if hidden else self.bytes_planned,
            "records_planned": None if hidden else self.records_planned,
            "delete_files": None if hidden else self.delete_files,
            "columns": ", ".join(self.columns),
            "pushed_filter": format_filter(self.user_filter),  # the restriction filter's values stay hidden
            "credential_source": loaded.credential_source,
            "credential_expires_at": iso_utc(loaded.expires_at) or "",
            "credential_usable_until": iso_utc(loaded.usable_until) or "",
            "cache": loaded.cache_outcome.value,
            "storage": describe_io(loaded.io),
            **describe_restrictions(self.restrictions, self.schema),
        }


def restricted_arrow_schema(
    read_schema: Schema, output_field_ids: Collection[int], restrictions: RestrictionPlan
) -> pa.Schema:
    """Arrow schema of restricted batches: the output columns (read-schema order), masked ones nullable.

    Shared by local scans and scan workers, so both stream exactly the same schema.
    """
    names = [f.name for f in read_schema.columns if f.field_id in output_field_ids]
    schema = schema_to_pyarrow(read_schema.select(*names), include_field_ids=False)
    masked = {read_schema.find_column_name(i) for i in restrictions.masked_field_ids}
    return pa.schema([f.with_nullable(True) if f.name in masked else f for f in schema])


def restriction_transform(
    restrictions: RestrictionPlan, read_schema: Schema, output_field_ids: frozenset[int], salt: bytes
) -> BatchTransform | None:
    """The per-batch read-restrictions step (row filter, drop filter-only columns, masks), or None if a no-op.

    Shared by local scans and scan workers: both apply a plan exactly the same way.
    """
    read_ids = {f.field_id for f in read_schema.columns}
    if not restrictions.is_restricted and read_ids == output_field_ids:
        return None

    def restrict(batch: pa.RecordBatch) -> pa.RecordBatch:
        return apply(batch, restrictions, salt=salt, schema=read_schema, output_field_ids=output_field_ids)

    return restrict


class TaskCache:
    """The file tasks of recent plans, reused while the table's metadata file stays the same.

    A metadata file and the manifest list and manifests it names are immutable, so the tasks found for one
    metadata location, snapshot, schema and row filter are exactly what planning again would find: a repeated
    query skips reading manifests. A Session owns one (one principal), so no plan crosses principals; the data
    files are still read with the FileIO of the table as loaded for the query.
    """

    def __init__(
        self,
        *,
        max_entries: int = 16,
        max_tasks: int = 100_000,
        metadata_io: Callable[[FileIO], FileIO] | None = None,
    ) -> None:
        """``metadata_io`` wraps a table's FileIO for the manifest reads of a plan (the session passes the
        execution layer's manifest cache; planning does not import it)."""
        self.max_entries = max_entries
        self.max_tasks = max_tasks  # all entries together: bounds the memory the cache holds
        self.metadata_io = metadata_io
        self.hits = 0
        self._entries: OrderedDict[Hashable, tuple[FileScanTask, ...]] = OrderedDict()
        self._listed: LRUCache[Hashable, tuple[int | None]] = LRUCache(max_entries)  # manifest lists' row counts
        # Projected schemas: pyiceberg's schema pruning is a pure function of the (immutable) metadata file,
        # the snapshot and the columns read, and costs a warm query a tenth of its own time.
        self._projections: LRUCache[Hashable, Schema] = LRUCache(4 * max_entries)
        self._lock = threading.Lock()

    def projection(self, key: Hashable | None, project: Callable[[], Schema]) -> Schema:
        """The projected schema kept for ``key``, else ``project()`` (kept when ``key`` is not None)."""
        kept = self._projections.get(key) if key is not None else None
        if kept is not None:
            return kept
        projected = project()
        if key is not None:
            self._projections.put(key, projected)
        return projected

    def peek(self, key: Hashable | None) -> tuple[FileScanTask, ...] | None:
        """The kept tasks of ``key``, or None; never plans."""
        if key is None:
            return None
        with self._lock:
            cached = self._entries.get(key)
            if cached is not None:
                self._entries.move_to_end(key)
                self.hits += 1
            return cached

    def tasks(self, key: Hashable | None, plan: Callable[[], tuple[FileScanTask, ...]]) -> tuple[FileScanTask, ...]:
        cached = self.peek(key)
        if cached is not None:
            return cached
        if key is None:
            return plan()
        tasks = plan()
        with self._lock:
            self._entries[key] = tasks
            while self._entries and (
                len(self._entries) > self.max_entries or sum(map(len, self._entries.values())) > self.max_tasks
            ):
                self._entries.popitem(last=False)
        return tasks

    def listed_rows(self, key: Hashable | None, count: Callable[[], int | None]) -> int | None:
        """The row count a manifest list states (``count`` reads it), kept per metadata location and manifest
        list like the tasks: a repeated bare ``count(*)`` decodes no manifest list again."""
        if key is None:
            return count()
        kept = self._listed.get(key)
        if kept is not None:
            with self._lock:
                self.hits += 1
            return kept[0]
        listed = count()
        self._listed.put(key, (listed,))  # as a 1-tuple: "no exact count" (None) is an answer worth keeping too
        return listed


def _task_key(loaded: LoadedTable, scan: DataScan, row_filter: BooleanExpression) -> Hashable | None:
    """What a scan's tasks depend on, or None when the table has no metadata location to vouch for it."""
    table = loaded.table
    snapshot = scan.snapshot()
    if not table.metadata_location or snapshot is None:
        return None
    return (table.metadata_location, snapshot.manifest_list, table.metadata.current_schema_id, repr(row_filter))


def _projection_key(loaded: LoadedTable, scan: DataScan) -> Hashable | None:
    """What ``scan.projection()`` depends on: the immutable metadata file, the snapshot (its schema) and the
    columns selected, by name and case sensitivity; None without a metadata location to vouch for it."""
    if not loaded.table.metadata_location:
        return None
    return (loaded.table.metadata_location, scan.snapshot_id, tuple(scan.selected_fields), scan.case_sensitive)


def _listed_key(loaded: LoadedTable, scan: DataScan) -> Hashable | None:
    """What a manifest list's row count depends on: the immutable metadata file and manifest list it names."""
    snapshot = scan.snapshot()
    if not loaded.table.metadata_location or snapshot is None:
        return None
    return (loaded.table.metadata_location, snapshot.manifest_list)


def _local_tasks(
    loaded: LoadedTable, scan: DataScan, row_filter: BooleanExpression, cache: TaskCache | None
) -> PlannedTasks:
    io = loaded.io
    if cache is not None and cache.metadata_io is not None:
        io = cache.metadata_io(loaded.io)  # manifest list and manifests read through the wrapped (still SQE's) FileIO
    # Within the manifest limits, always; pyiceberg builds its manifest planner from scan.io on first use, so it
    # must not have been built yet.
    scan.__dict__.pop("_manifest_planner", None)
    scan.io = bounded_io(io, _manifest_bounds(loaded, scan))
    key = None if cache is None else _task_key(loaded, scan, row_filter)

    def plan() -> tuple[FileScanTask, ...]:
        with _planning_errors(loaded.ident):
            return _plan_locally(scan) if cache is None else cache.tasks(key, lambda: _plan_locally(scan))

    def kept() -> tuple[FileScanTask, ...] | None:
        return None if cache is None else cache.peek(key)

    def listed_rows() -> int | None:
        with _planning_errors(loaded.ident):
            if cache is None:
                return listed_row_count(scan)
            return cache.listed_rows(_listed_key(loaded, scan), lambda: listed_row_count(scan))

    return PlannedTasks(plan, kept=kept, listed_rows=listed_rows)


def _manifest_bounds(loaded: LoadedTable, scan: DataScan) -> ManifestBounds:
    """A refusal naming the table, and the scan snapshot's manifest list by its kind."""
    snapshot = scan.snapshot()
    lists = frozenset() if snapshot is None else frozenset({snapshot.manifest_list})
    return ManifestBounds(f"cannot plan a scan of {loaded.ident}", lists)


def _plan_locally(scan: DataScan) -> tuple[FileScanTask, ...]:
    """pyiceberg's local planning (always local: planning must go through SQE's FileIO), with manifests read by
    :mod:`sqe.planning.manifests` (one reader setup per manifest schema instead of one per manifest file)."""
    return plan_tasks(scan)


def listed_row_count(scan: DataScan) -> int | None:
    """The live rows of the scan's snapshot from its manifest list: the sum of each data manifest's added and
    existing row counts (the spec's counts of its ADDED and EXISTING entries, the files a plan keeps).

    None when any manifest holds delete files or lacks a row count (v1 writers may omit them): then only the
    manifests themselves can tell. A snapshot-less table has no rows."""
    snapshot = scan.snapshot()
    if snapshot is None:
        return 0
    total = 0
    for manifest in snapshot.manifests(scan.io):
        if manifest.content != ManifestContent.DATA:
            return None
        added, existing = manifest.added_rows_count, manifest.existing_rows_count
        if not isinstance(added, int) or not isinstance(existing, int) or added < 0 or existing < 0:
            return None
        total += added + existing
    return total


def plan_scan(
    loaded: LoadedTable,
    *,
    columns: Sequence[str] | None,
    pushdown: BooleanExpression = ALWAYS_TRUE,
    snapshot_id: int | None = None,
    cache: TaskCache | None = None,
    remote: RemotePlanner | None = None,
    defer_tasks: bool = False,
    background: bool = False,
) -> ScanPlan:
    """Plan the files of one table scan. ``columns=None`` reads every column; names match case-insensitively.

    ``cache`` reuses the tasks of an earlier plan of the same table metadata and row filter. ``remote`` (server-side
    planning switched on) asks the catalog for the tasks instead; they may come with their own credentials.
    ``defer_tasks`` leaves reading the manifests to the plan's first use of its tasks (a bare ``count(*)`` may
    be answered from the manifest list alone; see :class:`PlannedTasks`); otherwise they are planned here, or with
    ``background`` on a background thread while the caller goes on (the first use of the tasks waits for them and
    raises planning's typed error)."""
    table = loaded.table
    refuse_encrypted(loaded)  # before any manifest list or data file is read
    if table.io is not loaded.io:
        raise QueryError(f"{loaded.ident}: the table is not bound to SQE's FileIO; refusing to plan")
    restrictions = restrictions_of(loaded)
    schema = _schema_for(loaded, snapshot_id)
    output = resolve_columns(schema, columns, loaded.ident) or tuple(f.name for f in schema.columns)
    output_ids = frozenset(schema.find_field(name).field_id for name in output)
    read_ids = required_columns(restrictions, output_ids)
    read_names = tuple(f.name for f in schema.columns if f.field_id in read_ids)
    user_filter = _safe_pushdown(schema, pushdown, masked_field_ids=restrictions.masked_field_ids)
    row_filter = join_conjuncts(
        [*split_conjuncts(restrictions.safe_pushdown_filter(schema)), *split_conjuncts(user_filter)]
    )
    scan = table.scan(row_filter=row_filter, selected_fields=read_names, snapshot_id=snapshot_id)
    with _planning_errors(loaded.ident):
        if remote is not None:
            loaded, tasks = remote.plan(loaded, row_filter=row_filter, selected=read_names, snapshot_id=snapshot_id)
            source = PlannedTasks.ready(tasks)
        else:
            source = _local_tasks(loaded, scan, row_filter, cache)
            if background and not defer_tasks:
                source.start()
            elif not defer_tasks:
                source.get()
        projected = (
            scan.projection() if cache is None else cache.projection(_projection_key(loaded, scan), scan.projection)
        )
    if snapshot_id is not None:
        projected = in_current_types(projected, table.metadata.schema())
        # the filter's columns newer than the snapshot: read as Iceberg reads a column a file lacks
        projected = with_absent_filter_fields(projected, restrictions, table.metadata.schema())
    return ScanPlan(
        loaded=loaded,
        task_source=source,
        read=_read_spec(loaded, projected, row_filter),
        restrictions=restrictions,
        columns=output,
        output_field_ids=output_ids,
        row_filter=row_filter,
        user_filter=user_filter,
        snapshot_id=snapshot_id if snapshot_id is not None else _current_snapshot_id(loaded),
        planned_at=time.time(),
        schema=schema,
    )


@contextmanager
def _planning_errors(ident: TableIdent) -> Iterator[None]:
    """pyiceberg's planning failures as SQE's typed one-line errors (SQE's own errors pass unchanged)."""
    try:
        yield
    except SQEError:
        raise
    except ValueError as exc:  # equality deletes, unknown snapshot, unbindable filter
        raise QueryError(f"cannot plan a scan of {ident}: {first_line(exc)}") from None
    except UNDECODABLE as exc:  # a manifest list or manifest within the limits whose records do not decode
        raise QueryError(f"cannot plan a scan of {ident}: {UNDECODED}: {first_line(exc)}") from None
    except OSError as exc:
        raise QueryError(f"cannot read the metadata of {ident}: {first_line(exc)}") from None


class PlannedTasks:
    """A scan's file tasks, planned from the manifests once (thread-safe), in the background or on first use.

    ``plan_scan(background=True)`` (the session's statements) starts planning on a background thread
    (:meth:`start`), so the manifest list and manifests are read while the session binds the statement in DuckDB
    and recognises its shape; whoever needs the tasks first (:meth:`get`) waits for them, and a planning failure
    is raised there, as the same typed error. A bare ``count(*)`` of an unrestricted table without delete files
    is answered from the manifest list's row counts (:meth:`listed_row_count`), so its plan
    (``plan_scan(defer_tasks=True)``) starts nothing and never reads the manifests unless asked.
    """

    def __init__(
        self,
        plan: Callable[[], tuple[FileScanTask, ...]],
        *,
        kept: Callable[[], tuple[FileScanTask, ...] | None] = lambda: None,
        listed_rows: Callable[[], int | None] = lambda: None,
    ) -> None:
        self._plan = plan
        self._kept = kept
        self._listed_rows = listed_rows
        self._tasks: tuple[FileScanTask, ...] | None = None
        self._pending: Future[tuple[FileScanTask, ...]] | None = None  # planning on a background thread
        self._listed: tuple[int | None] | None = None  # (the answer,) once asked
        self._lock = threading.Lock()

    @classmethod
    def ready(cls, tasks: tuple[FileScanTask, ...]) -> PlannedTasks:
        source = cls(lambda: tasks)
        source._tasks = tasks
        return source

    def start(self) -> None:
        """Begin planning on a background thread unless the tasks are known already (planned, or in the task
        cache: then nothing is started). The thread runs in a copy of the caller's context variables."""
        with self._lock:
            if self._tasks is not None or self._pending is not None:
                return
            self._tasks = self._kept()
            if self._tasks is not None:
                return
            pending = self._pending = Future()
        # A daemon thread, not a pool: nothing to shut down, and a stuck read never holds up interpreter exit.
        thread = threading.Thread(
            target=contextvars.copy_context().run, args=(_plan_into, self._plan, pending), name="sqe-plan", daemon=True
        )
        thread.start()

    def get(self) -> tuple[FileScanTask, ...]:
        with self._lock:
            if self._tasks is not None:
                return self._tasks
            pending = self._pending
            if pending is None:
                self._tasks = self._plan()
                return self._tasks
        tasks = pending.result()  # the background planning's result, or its (typed) error raised here
        with self._lock:
            self._tasks = tasks
        return tasks

    def planned(self) -> tuple[FileScanTask, ...] | None:
        """The tasks if they are known without reading a manifest (planned already, or in the task cache)."""
        with self._lock:
            if self._tasks is None:
                self._tasks = self._kept()
            return self._tasks

    def listed_row_count(self) -> int | None:
        """Live rows of the snapshot's data files from its manifest list alone, or None when that is not exact
        (a delete manifest, a manifest without row counts) or not known; reads the manifest list only, once
        (the plan's snapshot never changes, so a prepared count asks again for nothing)."""
        with self._lock:
            if self._listed is None:
                self._listed = (self._listed_rows(),)
            return self._listed[0]


def _plan_into(plan: Callable[[], tuple[FileScanTask, ...]], pending: Future[tuple[FileScanTask, ...]]) -> None:
    try:
        pending.set_result(plan())
    except BaseException as exc:  # every failure reaches the thread that waits, none is lost on this one
        pending.set_exception(exc)


def refuse_encrypted(loaded: LoadedTable) -> None:
    """Encrypted tables fail with a typed error: SQE has no KMS and would otherwise read ciphertext.

    Only the inline metadata of the load-table response is consulted: SQE never rereads ``metadata-location``
    from storage, so it stays inside the catalog's integrity guarantee (the catalog verified that metadata)."""
    metadata = loaded.raw.get("metadata") or {}
    properties = metadata.get("properties") or {}
    if ENCRYPTION_KEY_ID in properties or ENCRYPTION_KEYS in metadata:
        raise EncryptedTableError(f"{loaded.ident}: encrypted Iceberg tables are not readable by SQE yet")


def restrictions_of(loaded: LoadedTable) -> RestrictionPlan:
    """The table's validated read-restrictions for this caller; anything unusable raises (fail closed)."""
    metadata = loaded.table.metadata
    raw = loaded.raw.get(vocabulary.READ_RESTRICTIONS)
    return parse_restrictions(raw, metadata.schema(), all_schemas=metadata.schemas)


def describe_restrictions(restrictions: RestrictionPlan, schema: Schema) -> dict[str, str]:
    """EXPLAIN's view: masked columns with their actions and whether a row filter applies (never its values).
    A mask follows its field id: it is named as ``schema`` (what the query reads) names that field, which at an
    older snapshot may be a name the column had before a rename; a field the schema lacks keeps today's name."""
    masked = ", ".join(
        f"{schema.find_column_name(m.field_id) or m.name} ({m.action})" for m in restrictions.column_masks
    )
    if restrictions.always_false:
        row_filter = "always false (no rows)"
    else:
        row_filter = "applied" if restrictions.row_filter is not None else "none"
    return {"masked_columns": masked, "row_filter": row_filter}


def resolve_columns(schema: Schema, columns: Sequence[str] | None, ident: TableIdent) -> tuple[str, ...]:
    """Map requested names to the schema's top-level names (case-insensitive, like SQL). Empty = all."""
    if columns is None:
        return ()
    by_lower: dict[str, list[str]] = {}
    for f in schema.columns:
        by_lower.setdefault(f.name.lower(), []).append(f.name)
    resolved: list[str] = []
    for name in columns:
        matches = [name] if name in {f.name for f in schema.columns} else by_lower.get(name.lower(), [])
        if len(matches) != 1:
            problem = "is ambiguous" if matches else "does not exist"
            raise QueryError(f"column {name!r} {problem} in {ident}")
        if matches[0] not in resolved:
            resolved.append(matches[0])
    return tuple(resolved)


def describe_io(io: object) -> str:
    """The FileIO's own secret-free description, if it has one."""
    describe = getattr(io, "describe", None)
    if callable(describe):
        try:
            return str(describe())
        except Exception:  # a description is informational; never fail EXPLAIN on it
            return type(io).__name__
    return type(io).__name__


_OPERATORS = {"eq": "=", "not-eq": "<>", "lt": "<", "lt-eq": "<=", "gt": ">", "gt-eq": ">="}


def format_filter(expr: BooleanExpression, *, values: bool = True) -> str:
    """A short SQL-like rendering of an unbound pyiceberg filter, for EXPLAIN. Without ``values`` each literal is
    ``?``: the filter's shape (columns and operators), for a log, where a WHERE's literal (an email, an account
    number a user searched for) must not go."""
    if expr == AlwaysTrue():
        return ""
    if isinstance(expr, And):
        return f"{_format_nested(expr.left, values)} AND {_format_nested(expr.right, values)}"
    if isinstance(expr, Or):
        return f"{_format_nested(expr.left, values)} OR {_format_nested(expr.right, values)}"
    if isinstance(expr, Not):
        return f"NOT {_format_nested(expr.child, values)}"
    data = json.loads(expr.model_dump_json())
    kind, term = data.get("type"), data.get("term")
    literal = _sql_literal if values else _placeholder
    if kind in _OPERATORS:
        return f"{term} {_OPERATORS[kind]} {literal(data.get('value'))}"
    if kind in ("in", "not-in"):
        listed = ", ".join(literal(v) for v in sorted(data.get("values", []), key=str))
        return f"{term} {'IN' if kind == 'in' else 'NOT IN'} ({listed})"
    if kind in ("is-null", "not-null"):
        return f"{term} IS {'NULL' if kind == 'is-null' else 'NOT NULL'}"
    if values:
        return str(expr)
    return f"{term} {kind} ?" if term is not None else type(expr).__name__  # starts-with and the like


def _sql_literal(value: Any) -> str:
    return "'" + value.replace("'", "''") + "'" if isinstance(value, str) else json.dumps(value)


def _placeholder(value: Any) -> str:
    return "?"


def _format_nested(expr: BooleanExpression, values: bool) -> str:
    text = format_filter(expr, values=values)
    return f"({text})" if isinstance(expr, Or) else text


def split_conjuncts(expr: BooleanExpression) -> list[BooleanExpression]:
    if isinstance(expr, And):
        return [*split_conjuncts(expr.left), *split_conjuncts(expr.right)]
    if expr == AlwaysTrue():
        return []
    return [expr]


def join_conjuncts(conjuncts: Sequence[BooleanExpression]) -> BooleanExpression:
    result: BooleanExpression = AlwaysTrue()
    for conjunct in conjuncts:
        result = conjunct if result == AlwaysTrue() else And(result, conjunct)
    return result


def _safe_pushdown(
    schema: Schema, pushdown: BooleanExpression, *, masked_field_ids: frozenset[int]
) -> BooleanExpression:
    """Keep the conjuncts that bind to this schema and touch no masked column; pushdown is only an optimisation."""
    kept: list[BooleanExpression] = []
    for conjunct in split_conjuncts(pushdown):
        try:
            field_ids = extract_field_ids(bind(schema, conjunct, case_sensitive=True))
        except (ValueError, TypeError) as exc:
            # the shape only: the conjunct's literal and the error quoting it come from the user's WHERE
            log.debug("not pushing %s: %s", format_filter(conjunct, values=False), type(exc).__name__)
            continue
        if field_ids & masked_field_ids:
            continue
        kept.append(conjunct)
    return join_conjuncts(kept)


def _read_spec(loaded: LoadedTable, projected: Schema, row_filter: BooleanExpression) -> ReadSpec:
    return build_read_spec(loaded.table.metadata, loaded.io, projected, row_filter)


def build_read_spec(metadata: TableMetadata, io: FileIO, projected: Schema, row_filter: BooleanExpression) -> ReadSpec:
    """What a reader needs besides the file tasks (shared by local scans and scan workers)."""
    table_schema = metadata.schema()
    # pyiceberg decides a file lacking a filter column by its initial-default: bound in the literals' representation
    bound = bind(with_internal_defaults(table_schema), row_filter, case_sensitive=True)
    # Same rule as pyiceberg's ArrowScan: nested list/map ids are not projected by id; filter columns are read.
    projected_ids = {
        fid for fid in projected.field_ids if not isinstance(projected.find_type(fid), (MapType, ListType))
    } | extract_field_ids(bound)
    return ReadSpec(
        io=io,
        # pyarrow's row-group pruning loses NaN rows of some float filters: files are read without those parts.
        bound_row_filter=nan_safe_filter(bound),
        projected_schema=projected,
        table_schema=table_schema,
        projected_field_ids=frozenset(projected_ids),
        name_mapping=metadata.name_mapping(),
        specs=metadata.specs(),
        format_version=metadata.format_version,
        promoted_filter_ids=_promoted_ids(metadata, extract_field_ids(bound)),
    )


def _promoted_ids(metadata: TableMetadata, field_ids: set[int]) -> frozenset[int]:
    """The fields of ``field_ids`` whose type in some schema of the table differs from the current one."""
    current = metadata.schema()
    promoted: set[int] = set()
    for schema in metadata.schemas:
        for field_id in field_ids - promoted:
            if field_id in schema.field_ids and schema.find_type(field_id) != current.find_type(field_id):
                promoted.add(field_id)
    return frozenset(promoted)


def _schema_for(loaded: LoadedTable, snapshot_id: int | None) -> Schema:
    metadata = loaded.table.metadata
    if snapshot_id is None:
        return metadata.schema()
    snapshot = metadata.snapshot_by_id(snapshot_id)
    if snapshot is None:
        raise QueryError(f"{loaded.ident} has no snapshot {snapshot_id}")
    for schema in metadata.schemas:
        if schema.schema_id == snapshot.schema_id:
            return schema
    return metadata.schema()


def in_current_types(projected: Schema, current: Schema) -> Schema:
    """A snapshot's projected schema with each primitive field (top level or in structs) in the type the current
    schema promoted it to (int to long, float to double, a wider decimal). The read-restrictions are validated
    against the current types, so a time-travel read must hold its values in them: a double filter compares
    doubles, sha-256 of a long hashes 8 bytes. pyiceberg's reader promotes the files' values as it does for the
    current snapshot."""
    fields = [_in_current_type(field, current) for field in projected.fields]
    if all(new is old for new, old in zip(fields, projected.fields, strict=True)):
        return projected
    return Schema(*fields, schema_id=projected.schema_id, identifier_field_ids=projected.identifier_field_ids)


def _in_current_type(field: NestedField, current: Schema) -> NestedField:
    kind = field.field_type
    if isinstance(kind, StructType):
        children = [_in_current_type(child, current) for child in kind.fields]
        if all(new is old for new, old in zip(children, kind.fields, strict=True)):
            return field
        return field.model_copy(update={"field_type": StructType(*children)})
    if not isinstance(kind, PrimitiveType):
        return field  # lists and maps: neither a row filter nor a mask reads inside them
    try:
        promoted = promote(kind, current.find_type(field.field_id))
    except (ValueError, ResolveError):  # not in the current schema, or not a promotion (an equal type raises none)
        return field
    return field if promoted == kind else field.model_copy(update={"field_type": promoted})


def _current_snapshot_id(loaded: LoadedTable) -> int | None:
    snapshot = loaded.table.metadata.current_snapshot()
    return snapshot.snapshot_id if snapshot is not None else None
