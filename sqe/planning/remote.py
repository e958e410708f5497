"""Server-side scan planning: the catalog finds a scan's file tasks, SQE never reads the manifests.

With ``[catalog] server_side_planning = true`` the planner sends the scan (snapshot, columns, the safe filter)
to the REST spec's ``POST .../tables/{t}/plan``, follows ``plan-tasks`` through ``POST .../tasks`` and, while a
plan is ``submitted``, polls ``GET .../plan/{plan-id}``. The catalog plans per user: a restricted caller's
files are pruned by its row filter and carry no statistics, so a catalog may keep manifests away from
restricted readers entirely. The tasks feed the same readers as local planning, with the same per-file
credentials: the table's own vended set, or the plan's ``storage-credentials`` when the answer carries them
(parsed by ``sqe.credentials``' one parser, through the catalog client).

Switched on, it never falls back: a catalog that does not advertise the endpoints, a failed or cancelled plan,
a plan still pending at the deadline, or plan tasks still coming at it (or one named twice) is a
``RemotePlanningError`` (a failed plan whose ErrorModel type the catalog error translator knows is that typed
error).

A deletion vector's delete file keeps what the plan states of its blob (``referenced-data-file``,
``content-offset``, ``content-size-in-bytes``, and its ``record-count``): the read holds the blob to them
(``sqe.execution.delete_limits``), as it does for a locally planned one.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pydantic
from pyiceberg.catalog.rest.scan_planning import (
    PlanCancelled,
    PlanCompleted,
    PlanFailed,
    PlanningResponse,
    PlanSubmitted,
    PlanTableScanRequest,
    RESTDeleteFile,
    RESTFileScanTask,
    RESTPositionDeleteFile,
    ScanTasks,
)
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, BoundSetPredicate, Not, Or, SetPredicate
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import FileScanTask
from pyiceberg.typedef import Record

from sqe._text import first_line
from sqe.catalog.errors import typed_catalog_error
from sqe.errors import CatalogError, RemotePlanningError
from sqe.planning.manifests import PlanningDataFile, own_deletes
from sqe.vocabulary import MAX_PLAN_FILTER_PREDICATES, MAX_PLAN_FILTER_VALUES, STORAGE_CREDENTIALS

if TYPE_CHECKING:
    from sqe.catalog.base import LoadedTable, ScanPlanningClient, TableIdent, TableProvider

__all__ = ["RemotePlanner", "RemoteTasks", "collect_tasks", "plan_request"]

_RESPONSE: pydantic.TypeAdapter[PlanCompleted | PlanSubmitted | PlanCancelled | PlanFailed] = pydantic.TypeAdapter(
    PlanningResponse  # type: ignore[arg-type]  # an Annotated discriminated union
)
_FIRST_POLL_SECONDS = 0.05
_MAX_POLL_SECONDS = 2.0
MIN_DEADLINE_SECONDS = 60.0


@dataclass(frozen=True)
class RemoteTasks:
    """What the catalog planned: the file tasks and, if the answer carried any, its storage credentials."""

    tasks: tuple[FileScanTask, ...]
    storage_credentials: list[Any] | None  # raw ``storage-credentials`` JSON of the completed plan


# Conjuncts join left-deep (one level each), so a chain of and (or of or) is sent as a balanced tree: pydantic cannot
# serialise a filter some 250 levels deep, and the catalog's parser refuses one about 140 deep. A filter still
# deeper than this (and/or/not alternating) is left out (it only prunes).
_MAX_FILTER_DEPTH = 64


def plan_request(row_filter: BooleanExpression, selected: Sequence[str], snapshot_id: int | None) -> dict[str, Any]:
    """The ``PlanTableScanRequest`` JSON for one scan (pyiceberg's model serialises the filter)."""
    fields: dict[str, Any] = {"select": list(selected), "case-sensitive": True}
    if snapshot_id is not None:
        fields["snapshot-id"] = snapshot_id
    sent = _sendable(row_filter)
    if sent is not None:
        fields["filter"] = sent
    request = PlanTableScanRequest.model_validate(fields)
    body: dict[str, Any] = json.loads(request.model_dump_json(by_alias=True, exclude_none=True))
    return body


def _sendable(row_filter: BooleanExpression) -> BooleanExpression | None:
    """``row_filter`` as sent to the catalog, or None: a filter only prunes (the rows are filtered again after the
    scan), so one the catalog would refuse is left out rather than failing the query."""
    if row_filter == AlwaysTrue():
        return None
    values, nodes, _ = _size(row_filter)
    if values > MAX_PLAN_FILTER_VALUES or nodes > MAX_PLAN_FILTER_PREDICATES:  # no balancing of a filter too long
        return None
    balanced = _balanced(row_filter, 1)
    return balanced if balanced is not None and _within_plan_limits(balanced) else None


def _within_plan_limits(expression: BooleanExpression) -> bool:
    """Whether the catalog takes ``expression`` as a plan filter: at most MAX_PLAN_FILTER_VALUES in/not-in values,
    MAX_PLAN_FILTER_PREDICATES nodes (each node serialises to one JSON object, the ones the catalog counts) and
    _MAX_FILTER_DEPTH levels."""
    values, nodes, deepest = _size(expression)
    within_depth = deepest <= _MAX_FILTER_DEPTH
    return values <= MAX_PLAN_FILTER_VALUES and nodes <= MAX_PLAN_FILTER_PREDICATES and within_depth


def _size(expression: BooleanExpression) -> tuple[int, int, int]:
    """The in/not-in values, the nodes and the levels of ``expression``, walked without recursion."""
    values, nodes, deepest, pending = 0, 0, 0, [(expression, 1)]
    while pending:
        node, depth = pending.pop()
        nodes, deepest = nodes + 1, max(deepest, depth)
        if isinstance(node, And | Or):
            pending += [(node.left, depth + 1), (node.right, depth + 1)]
        elif isinstance(node, Not):
            pending.append((node.child, depth + 1))
        elif isinstance(node, SetPredicate | BoundSetPredicate):
            values += len(node.literals)
    return values, nodes, deepest


def _balanced(expression: BooleanExpression, depth: int) -> BooleanExpression | None:
    """``expression`` (its root at level ``depth``) with each chain of and (or of or) joined as a balanced tree, or
    None if it would still nest deeper than _MAX_FILTER_DEPTH (recursion stops there)."""
    if depth > _MAX_FILTER_DEPTH:
        return None
    if isinstance(expression, Not):
        child = _balanced(expression.child, depth + 1)
        return None if child is None else Not(child)
    if not isinstance(expression, And | Or):
        return expression
    kind = type(expression)
    chain = _chain(expression, kind)
    below = depth + math.ceil(math.log2(len(chain)))  # the deepest level an operand lands on
    operands = [_balanced(operand, below) for operand in chain]
    kept = [operand for operand in operands if operand is not None]
    return _joined(kind, kept) if len(kept) == len(operands) else None


def _chain(expression: BooleanExpression, kind: type[And] | type[Or]) -> list[BooleanExpression]:
    """The operands of ``expression``'s run of ``kind`` nodes, in order, walked without recursion."""
    operands: list[BooleanExpression] = []
    pending = [expression]
    while pending:
        node = pending.pop()
        if type(node) is kind:
            pending += [node.right, node.left]
        else:
            operands.append(node)
    return operands


def _joined(kind: type[And] | type[Or], operands: list[BooleanExpression]) -> BooleanExpression:
    if len(operands) == 1:
        return operands[0]
    half = len(operands) // 2
    return kind(_joined(kind, operands[:half]), _joined(kind, operands[half:]))


def collect_tasks(
    client: ScanPlanningClient,
    ident: TableIdent,
    request: Mapping[str, Any],
    *,
    deadline_seconds: float,
    sleep: Callable[[float], None] = time.sleep,
) -> RemoteTasks:
    """Submit the plan, wait while it is ``submitted``, then gather every task (``plan-tasks`` included)."""
    answer = client.submit_plan(ident, request)
    response = _parsed(answer, ident)
    deadline = time.monotonic() + deadline_seconds
    pause = _FIRST_POLL_SECONDS
    while isinstance(response, PlanSubmitted):
        if not response.plan_id:
            raise RemotePlanningError(f"the catalog submitted a plan for {ident} without a plan-id")
        if time.monotonic() >= deadline:
            _cancel_quietly(client, ident, response.plan_id)
            raise RemotePlanningError(f"the catalog did not finish planning {ident} within {deadline_seconds:.0f}s")
        sleep(pause)
        pause = min(pause * 2, _MAX_POLL_SECONDS)
        answer = client.fetch_plan(ident, response.plan_id)
        response = _parsed(answer, ident)
    if isinstance(response, PlanFailed):
        raise _plan_failure(response, ident)
    if isinstance(response, PlanCancelled):
        raise RemotePlanningError(f"the catalog cancelled the plan of {ident}")
    assert isinstance(response, PlanCompleted)
    tasks = _tasks_of(response, ident)
    pending = list(response.plan_tasks)
    seen: set[str] = set()
    while pending:
        # The deadline covers the plan tasks too, and a token named twice is refused: no catalog keeps us forever.
        token = pending.pop(0)
        if token in seen:
            raise RemotePlanningError(f"the catalog's plan tasks for {ident} name the same plan task twice")
        if time.monotonic() >= deadline:
            raise RemotePlanningError(
                f"the catalog did not hand out the plan tasks of {ident} within {deadline_seconds:.0f}s"
            )
        seen.add(token)
        batch = _scan_tasks(client.fetch_plan_tasks(ident, token), ident)
        tasks.extend(_tasks_of(batch, ident))
        pending.extend(batch.plan_tasks)
    credentials = answer.get(STORAGE_CREDENTIALS)
    return RemoteTasks(tuple(tasks), list(credentials) if isinstance(credentials, list) else None)


def _plan_failure(failed: PlanFailed, ident: TableIdent) -> CatalogError:
    """A failed plan's ErrorModel, through the catalog's one error translator: a type it knows (a table dropped
    meanwhile, a grant revoked) is that typed error; any other failure is a ``RemotePlanningError``."""
    if failed.error is None:
        return RemotePlanningError(f"the catalog failed to plan {ident}: no details")
    message = first_line(failed.error.message)
    typed = typed_catalog_error(failed.error.code, failed.error.type, message, f"planning {ident}")
    return typed or RemotePlanningError(f"the catalog failed to plan {ident}: {message}")


def _parsed(answer: Mapping[str, Any], ident: TableIdent) -> Any:
    try:
        return _RESPONSE.validate_python(dict(answer))
    except pydantic.ValidationError as exc:
        where = "; ".join(".".join(str(p) for p in e.get("loc", ())) for e in exc.errors()[:3])
        raise RemotePlanningError(f"the catalog's plan for {ident} is not valid (at {where or 'body'})") from None


def _scan_tasks(answer: Mapping[str, Any], ident: TableIdent) -> ScanTasks:
    try:
        return ScanTasks.model_validate(dict(answer))
    except pydantic.ValidationError:
        raise RemotePlanningError(f"the catalog's plan tasks for {ident} are not valid") from None


def _tasks_of(batch: ScanTasks, ident: TableIdent) -> list[FileScanTask]:
    try:
        return [_task_of(task, batch.delete_files) for task in batch.file_scan_tasks]
    except NotImplementedError as exc:  # equality deletes: pyiceberg cannot apply them
        raise RemotePlanningError(f"cannot read the plan of {ident}: {first_line(exc)}") from None


def _task_of(task: RESTFileScanTask, delete_files: list[RESTDeleteFile]) -> FileScanTask:
    """pyiceberg's task of ``task``, its delete files read as v3 entries: pyiceberg's own conversion drops a
    deletion vector's ``referenced-data-file``, ``content-offset`` and ``content-size-in-bytes`` (by which the read
    holds its blob to what the plan states) and keeps one delete file per path (deletion vectors share one)."""
    # pyiceberg's model checked each reference is in range; its conversion gives the data file and the residual
    # (and refuses equality deletes)
    converted = FileScanTask.from_rest_response(task, delete_files)
    deletes = {_delete_file(delete_files[ref]) for ref in task.delete_file_references or []}
    return own_deletes(FileScanTask(converted.file, delete_files=deletes, residual=converted.residual))


def _delete_file(rest: RESTDeleteFile) -> DataFile:
    """A position delete file of a plan as a v3 delete-file entry (what a v3 manifest states of it)."""
    vector: dict[str, Any] = {}
    if isinstance(rest, RESTPositionDeleteFile):
        vector = {
            "referenced_data_file": rest.referenced_data_file,
            "content_offset": rest.content_offset,
            "content_size_in_bytes": rest.content_size_in_bytes,
        }
    delete_file = PlanningDataFile.from_args(
        3,
        content=DataFileContent.from_rest_type(rest.content),
        file_path=rest.file_path,
        file_format=rest.file_format,
        partition=Record(*rest.partition) if rest.partition else Record(),
        record_count=rest.record_count,
        file_size_in_bytes=rest.file_size_in_bytes,
        split_offsets=rest.split_offsets,
        sort_order_id=rest.sort_order_id,
        **vector,
    )
    delete_file.spec_id = rest.spec_id
    return delete_file


def _cancel_quietly(client: ScanPlanningClient, ident: TableIdent, plan_id: str) -> None:
    try:
        client.cancel_plan(ident, plan_id)
    except Exception:  # the plan expires on its own; the timeout is the error that matters
        return


class RemotePlanner:
    """Server-side planning for one session's tables (one user); built only when the switch is on."""

    def __init__(self, provider: TableProvider, *, deadline_seconds: float = MIN_DEADLINE_SECONDS) -> None:
        self._provider = provider
        self._deadline = max(deadline_seconds, MIN_DEADLINE_SECONDS)
        self.plans = 0  # plans the catalog answered (tests, diagnostics)

    def plan(
        self,
        loaded: LoadedTable,
        *,
        row_filter: BooleanExpression,
        selected: Sequence[str],
        snapshot_id: int | None,
    ) -> tuple[LoadedTable, tuple[FileScanTask, ...]]:
        """The catalog's tasks for this scan, and the table as they are to be read (its FileIO)."""
        ident = loaded.ident
        client = self._provider.scan_planning(ident.warehouse)
        if client is None:
            raise RemotePlanningError(
                f"[catalog] server_side_planning is on, but the catalog of warehouse {ident.warehouse!r} does not "
                "advertise the scan planning endpoints; switch it off to plan locally"
            )
        planned = collect_tasks(
            client, ident, plan_request(row_filter, selected, snapshot_id), deadline_seconds=self._deadline
        )
        self.plans += 1
        if not planned.storage_credentials:
            return loaded, planned.tasks
        io = client.file_io_for_plan(loaded, planned.storage_credentials)
        return _reading_with(loaded, io), planned.tasks


def _reading_with(loaded: LoadedTable, io: Any) -> LoadedTable:
    """``loaded`` whose table reads through ``io`` (the plan's own credentials)."""
    table = copy.copy(loaded.table)
    table.io = io
    return dataclasses.replace(
        loaded,
        table=table,
        io=io,
        credential_source=io.source,
        usable_until=io.usable_until,
        expires_at=io.expires_at,
    )
