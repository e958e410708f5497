"""Server-side scan planning (the REST spec's ``POST .../plan``, ``.../tasks``, ``GET``/``DELETE .../plan/{id}``).

The catalog plans with pyiceberg over the table it holds, per caller, so a client never needs the manifests:

- the caller's required row filter (its read-restrictions) always prunes files;
- an unrestricted caller's own ``filter`` prunes too; a restricted caller's does not, and its data files carry no
  column statistics, so nothing returned is derived from statistics of rows the row filter hides;
- planning reads the manifest list and manifests with the catalog's key, so only files under the table's own
  locations: a snapshot whose manifests lie elsewhere (another table's) is refused (422), never planned;
- a manifest list or manifest is read only up to ``MAX_MANIFEST_BYTES`` and inflated only up to
  ``MAX_MANIFEST_DECOMPRESSED_BYTES`` (``sqe.planning.avro_limits``): a larger one is refused (422);
- manifests are read as the engine's own planner reads them (``sqe.planning.manifests``): as format v3 entries,
  so a deletion vector's ``referenced-data-file``, ``content-offset`` and ``content-size-in-bytes`` are planned
  and sent, each deletion vector its own delete file (several share one Puffin file, at different offsets), on
  the task of the data file it names only;
- plans are kept in memory for ``plan_lifetime_seconds`` and belong to the principal (and actor) that made
  them, under the read-restrictions it had then: another caller's plan id, or one made before the caller's
  restrictions changed, is a 404, never someone else's (or an unrestricted caller's) files.

Planning completes synchronously; tasks beyond ``TASKS_PER_RESPONSE`` are handed out as plan-task tokens.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, cast

from pyiceberg.catalog.rest.scan_planning import PlanTableScanRequest
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression
from pyiceberg.io import FileIO, InputFile, OutputFile
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import FileScanTask, Table

from sqe._text import first_line
from sqe.credentials.paths import covered_by_any
from sqe.planning.avro_limits import UNDECODABLE, UNDECODED, BoundedManifestFile
from sqe.planning.manifests import content_offset, content_size, plan_tasks, referenced_data_file
from sqe.restrictions import parse_restrictions
from sqe.vocabulary import MAX_PLAN_FILTER_PREDICATES, MAX_PLAN_FILTER_VALUES
from sqe_catalog.avro_limits import CatalogManifestBounds, ManifestLimitError
from sqe_catalog.errors import BadRequestError, NotFoundError, UnprocessableEntityError
from sqe_catalog.tables import StoredTable, validate_client_model

__all__ = [
    "MAX_PLANS_PER_CALLER",
    "TASKS_PER_RESPONSE",
    "PlanOwner",
    "PlanStore",
    "parse_plan_request",
    "plan_files",
]

TASKS_PER_RESPONSE = 100
# Plans one caller holds at once: its oldest makes room for a new one, so no caller fills the catalog's memory.
MAX_PLANS_PER_CALLER = 64


def parse_plan_request(body: dict[str, Any]) -> PlanTableScanRequest:
    # Counted before pyiceberg parses and binds every value and predicate of the filter.
    listed, predicates = _filter_size(body.get("filter"))
    if listed > MAX_PLAN_FILTER_VALUES:
        raise BadRequestError(
            f"the filter's in/not-in predicates list {listed} values, more than {MAX_PLAN_FILTER_VALUES} "
            "(MAX_PLAN_FILTER_VALUES); send a shorter filter or none (the filter only prunes)"
        )
    if predicates > MAX_PLAN_FILTER_PREDICATES:
        raise BadRequestError(
            f"the filter holds {predicates} predicates (and/or/not included), more than "
            f"{MAX_PLAN_FILTER_PREDICATES} (MAX_PLAN_FILTER_PREDICATES); send a shorter filter or none "
            "(the filter only prunes)"
        )
    request = validate_client_model(PlanTableScanRequest, body)
    if request.start_snapshot_id is not None:
        raise BadRequestError("incremental scan planning (start-snapshot-id) is not supported")
    return request


def _filter_size(node: object) -> tuple[int, int]:
    """How many values the ``values`` lists of a filter's JSON hold, and how many objects (predicates, and/or/not)
    it has, walked without recursion."""
    count, objects, pending = 0, 0, [node]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            objects += 1
            values = item.get("values")
            count += len(values) if isinstance(values, list) else 0
            pending.extend(value for key, value in item.items() if key != "values")
        elif isinstance(item, list):
            pending.extend(item)
    return count, objects


def plan_files(
    stored: StoredTable, io: FileIO, request: PlanTableScanRequest, restrictions_wire: Any | None
) -> list[dict[str, Any]]:
    """The file scan tasks of ``stored`` for one caller, as REST JSON (``restrictions_wire`` None: unrestricted)."""
    metadata = stored.metadata
    own_io = _TableFilesIO(io, stored.locations, frozenset(s.manifest_list for s in metadata.snapshots))
    table = Table((*stored.namespace, stored.name), metadata, stored.metadata_location or "", own_io, cast(Any, None))
    required: BooleanExpression = AlwaysTrue()
    if restrictions_wire is not None:
        required = parse_restrictions(
            restrictions_wire, metadata.schema(), all_schemas=metadata.schemas
        ).safe_pushdown_filter(metadata.schema())
    user_filter = request.filter if request.filter is not None and restrictions_wire is None else AlwaysTrue()
    try:
        scan = table.scan(
            row_filter=And(required, user_filter),
            snapshot_id=request.snapshot_id,
            case_sensitive=request.case_sensitive,
        )
        tasks = plan_tasks(scan)
    except ValueError as exc:  # unknown snapshot, unbindable filter
        raise BadRequestError(f"cannot plan this scan: {first_line(str(exc)) or 'invalid'}") from None
    except UNDECODABLE as exc:  # the table's own files are at fault: a 422, as for one past the read limits
        raise ManifestLimitError(f"cannot plan this scan: {UNDECODED}: {first_line(exc)}") from None
    with_stats = restrictions_wire is None
    return [_task_json(task, with_stats) for task in tasks]


class _TableFilesIO(FileIO):
    """The catalog's FileIO for planning one table: it reads only files under the table's own locations.

    Manifest lists and manifests are client-written paths read with the catalog's key; one outside the table
    (another table's manifests) would hand the caller that table's file list and statistics."""

    def __init__(self, io: FileIO, locations: tuple[str, ...], manifest_lists: frozenset[str]) -> None:
        super().__init__(io.properties)
        self._io, self._locations = io, locations
        self._bounds = CatalogManifestBounds(manifest_lists=manifest_lists)  # names a refused file's kind

    def new_input(self, location: str) -> InputFile:
        if not covered_by_any(location, self._locations):
            raise _ForeignManifest("cannot plan this scan: the snapshot reads manifests outside the table's locations")
        return BoundedManifestFile(self._io.new_input(location), self._bounds)  # sized before pyiceberg reads it

    def new_output(self, location: str) -> OutputFile:
        raise NotImplementedError("planning never writes")

    def delete(self, location: str | InputFile | OutputFile) -> None:
        raise NotImplementedError("planning never deletes")


class _ForeignManifest(UnprocessableEntityError):
    """The table's own metadata points planning outside the table: no retry or other caller changes that."""


def _task_json(task: FileScanTask, with_stats: bool) -> dict[str, Any]:
    return {
        "data-file": _file_json(task.file, with_stats),
        "delete-files": [_file_json(d, False) for d in task.delete_files],
    }


def _file_json(file: DataFile, with_stats: bool) -> dict[str, Any]:
    content = {
        DataFileContent.DATA: "data",
        DataFileContent.POSITION_DELETES: "position-deletes",
        DataFileContent.EQUALITY_DELETES: "equality-deletes",
    }[file.content]
    body: dict[str, Any] = {
        "content": content,
        "file-path": file.file_path,
        "file-format": str(file.file_format.value).lower(),
        "spec-id": file.spec_id or 0,
        "partition": [file.partition[i] for i in range(len(file.partition))] if file.partition is not None else [],
        "file-size-in-bytes": file.file_size_in_bytes,
        "record-count": file.record_count,
    }
    if file.content == DataFileContent.EQUALITY_DELETES and file.equality_ids:
        body["equality-ids"] = list(file.equality_ids)
    if file.content == DataFileContent.POSITION_DELETES:
        body |= _vector_fields(file)
    if with_stats:
        for key, values in (
            ("column-sizes", file.column_sizes),
            ("value-counts", file.value_counts),
            ("null-value-counts", file.null_value_counts),
        ):
            if values:
                body[key] = {"keys": list(values), "values": list(values.values())}
    return body


def _vector_fields(file: DataFile) -> dict[str, Any]:
    """A v3 position delete file's ``referenced-data-file``, ``content-offset`` and ``content-size-in-bytes``
    (a deletion vector's blob in its Puffin file), as far as its entry states them."""
    stated = {
        "referenced-data-file": referenced_data_file(file),
        "content-offset": content_offset(file),
        "content-size-in-bytes": content_size(file),
    }
    return {key: value for key, value in stated.items() if value is not None}


def _delete_identity(delete: dict[str, Any]) -> str:
    """A delete file's whole JSON: deletion vectors share their Puffin file's path, so the path alone merges them."""
    return json.dumps(delete, sort_keys=True)


def response_tasks(tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """``file-scan-tasks`` plus the shared ``delete-files`` list they reference by index."""
    delete_files: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    scan_tasks = []
    for task in tasks:
        refs = []
        for delete in task["delete-files"]:
            identity = _delete_identity(delete)
            if identity not in index:
                index[identity] = len(delete_files)
                delete_files.append(delete)
            refs.append(index[identity])
        entry: dict[str, Any] = {"data-file": task["data-file"]}
        if refs:
            entry["delete-file-references"] = refs
        scan_tasks.append(entry)
    return {"delete-files": delete_files, "file-scan-tasks": scan_tasks}


# (principal, actor or "", digest of its read-restrictions or ""): a plan is served only under the restrictions
# it was made with, so one made before a restriction was added never hands out the unrestricted files and stats.
PlanOwner = tuple[str, str, str]


@dataclass
class _Plan:
    owner: PlanOwner
    table: tuple[str, tuple[str, ...], str]  # (warehouse, namespace, table)
    chunks: list[list[dict[str, Any]]]
    expires_at: float

    @property
    def tasks(self) -> int:
        return sum(len(chunk) for chunk in self.chunks)


class PlanStore:
    """Completed plans by id, per owner, for a bounded time. Thread-safe.

    A caller holds at most ``MAX_PLANS_PER_CALLER`` plans and ``max_tasks_per_caller`` file tasks in all (each task
    keeps a data file's path, partition and statistics in memory): a new plan drops the caller's oldest until both
    hold, so repeating the plan of a table with many files cannot fill the catalog's memory. A single plan larger
    than the task bound is kept alone."""

    def __init__(self, lifetime_seconds: int, max_tasks_per_caller: int) -> None:
        self._lifetime = lifetime_seconds
        self._max_tasks = max_tasks_per_caller
        self._lock = threading.Lock()
        self._plans: dict[str, _Plan] = {}

    def add(
        self, owner: PlanOwner, table: tuple[str, tuple[str, ...], str], tasks: list[dict[str, Any]]
    ) -> tuple[str, list[dict[str, Any]], list[str]]:
        """Store a plan; returns (plan id, the first chunk of tasks, plan-task tokens for the other chunks)."""
        chunks = [tasks[i : i + TASKS_PER_RESPONSE] for i in range(0, len(tasks), TASKS_PER_RESPONSE)] or [[]]
        plan_id = secrets.token_urlsafe(18)
        now = time.monotonic()
        with self._lock:
            self._plans = {k: p for k, p in self._plans.items() if p.expires_at > now}
            mine = [k for k, p in self._plans.items() if p.owner[:2] == owner[:2]]  # oldest first
            held = sum(self._plans[k].tasks for k in mine)
            while mine and (len(mine) >= MAX_PLANS_PER_CALLER or held + len(tasks) > self._max_tasks):
                held -= self._plans.pop(mine.pop(0)).tasks
            self._plans[plan_id] = _Plan(owner, table, chunks, now + self._lifetime)
        return plan_id, chunks[0], [f"{plan_id}.{i}" for i in range(1, len(chunks))]

    def get(self, plan_id: str, owner: PlanOwner, table: tuple[str, tuple[str, ...], str]) -> list[dict[str, Any]]:
        """Every task of the plan (404 for an unknown, expired or foreign plan)."""
        plan = self._find(plan_id, owner, table)
        return [task for chunk in plan.chunks for task in chunk]

    def chunk(self, token: str, owner: PlanOwner, table: tuple[str, tuple[str, ...], str]) -> list[dict[str, Any]]:
        plan_id, _, index = token.rpartition(".")
        plan = self._find(plan_id, owner, table)
        # Only the tokens handed out: never int() of an over-long or non-ASCII digit string (a ValueError, a 500).
        position = int(index) if index.isascii() and index.isdigit() and len(index) <= 9 else 0
        if str(position) != index or not 0 < position < len(plan.chunks):
            raise _NoSuchPlanTask("unknown plan task")
        return plan.chunks[position]

    def cancel(self, plan_id: str, owner: PlanOwner, table: tuple[str, tuple[str, ...], str]) -> None:
        self._find(plan_id, owner, table)
        with self._lock:
            self._plans.pop(plan_id, None)

    def held(self, owner: PlanOwner) -> int:
        """The plans ``owner`` (whatever its restrictions) holds now."""
        with self._lock:
            return sum(1 for p in self._plans.values() if p.owner[:2] == owner[:2])

    def _find(self, plan_id: str, owner: PlanOwner, table: tuple[str, tuple[str, ...], str]) -> _Plan:
        with self._lock:
            plan = self._plans.get(plan_id)
        if plan is None or plan.expires_at <= time.monotonic() or plan.owner != owner or plan.table != table:
            raise _NoSuchPlanId("unknown or expired plan id")
        return plan


class _NoSuchPlanId(NotFoundError, error_type="NoSuchPlanIdException"):
    pass


class _NoSuchPlanTask(NotFoundError, error_type="NoSuchPlanTaskException"):
    pass
