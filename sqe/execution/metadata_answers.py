"""Answers from table metadata where they are exact and allowed: a bare ``SELECT count(*) FROM t``.

The planned data files' record counts (from the manifests) add up to the table's row count exactly when the
scan has no delete files, no filter at all (neither the user's nor a row filter) and every file states its
count. The manifest list states the same sums per manifest (its added and existing row counts), so when it
lists data manifests only, each with both counts, the answer needs the manifest list alone. It is never used
for a restricted table (a row filter, a mask or an always-false plan): nothing about a restricted table's rows
comes from raw statistics. Anything else, even a slightly different query, runs as usual. The caller must have
planned the query first: the count comes from the snapshot planned in this query, after the catalog has
authorized the user for the table.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
from pyiceberg.expressions import AlwaysTrue

if TYPE_CHECKING:
    from pyiceberg.table import FileScanTask

    from sqe.catalog.base import TableIdent
    from sqe.planning.planner import ScanPlan

# DuckDB names an unaliased count(*) column like this; the metadata answer must look the same.
DUCKDB_COUNT_STAR = "count_star()"
_BARE_COUNT = re.compile(
    r"""\s*select\s+count\s*\(\s*\*\s*\)\s*(?:as\s+(?P<alias>[A-Za-z_][A-Za-z0-9_]*)\s+)?from\s+[A-Za-z0-9_."]+\s*;?\s*""",
    re.IGNORECASE,
)


def may_count_from_metadata(sql: str) -> bool:
    """Whether ``sql`` has the shape :func:`count_from_manifests` may answer (its plan's tasks can wait)."""
    return _BARE_COUNT.fullmatch(sql) is not None


def count_from_manifests(sql: str, scans: Mapping[TableIdent, ScanPlan]) -> pa.Table | None:
    """The one-row answer of ``sql`` when it is a bare count of one table that metadata answers exactly; else
    None (run the query)."""
    match = _BARE_COUNT.fullmatch(sql)
    if match is None or len(scans) != 1:
        return None
    [plan] = scans.values()
    count = exact_row_count(plan)
    if count is None:
        return None
    name = match.group("alias") or DUCKDB_COUNT_STAR
    return pa.table({name: pa.array([count], pa.int64())})


def exact_row_count(plan: ScanPlan) -> int | None:
    """The rows the plan's files hold, from their record counts, when that is exactly what a scan would
    return; None for a restricted table, a filtered scan, delete files or a file without a count.

    Tasks already known (planned, or in the session's task cache) answer without a request. Otherwise the
    manifest list's per-manifest row counts answer when they are exact (data manifests only, every count
    present), so the manifests are never read; failing that, the plan's files are planned and counted."""
    if plan.restrictions.is_restricted:
        return None
    if not isinstance(plan.row_filter, AlwaysTrue) or not isinstance(plan.user_filter, AlwaysTrue):
        return None
    tasks = plan.task_source.planned()
    if tasks is None:
        listed = plan.task_source.listed_row_count()
        if listed is not None:
            return listed
        tasks = plan.tasks
    return _counted_tasks(tasks)


def _counted_tasks(tasks: Sequence[FileScanTask]) -> int | None:
    if any(task.delete_files for task in tasks):
        return None
    counts = [task.file.record_count for task in tasks]
    if any(not isinstance(count, int) or count < 0 for count in counts):
        return None
    return sum(counts)
