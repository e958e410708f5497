"""Deferred planning: a bare count is answered from the manifest list alone when that is exact; anything else
plans from the manifests exactly as an eager plan does, with the same typed errors."""

from __future__ import annotations

import pytest
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.expressions.parser import parse
from pyiceberg.io import FileIO, InputFile

from sqe.catalog.base import TableIdent
from sqe.errors import QueryError
from sqe.execution.metadata_answers import exact_row_count, may_count_from_metadata
from sqe.planning.planner import TaskCache, plan_scan
from tests.helpers.read_only_io import ReadOnlyIO
from tests.unit.sqe.iceberg_local import NUMBER_FILES, ROWS_PER_FILE, LocalProvider

NUMBERS = TableIdent("wh", ("ns",), "numbers")
DELETED = TableIdent("wh", ("ns",), "deleted")
TOTAL = NUMBER_FILES * ROWS_PER_FILE


class RecordingIO(ReadOnlyIO):
    """Planning's metadata reads, recorded by location (reads go to the table's own FileIO)."""

    def __init__(self, inner: FileIO, seen: list[str], fail: bool = False) -> None:
        super().__init__(inner)
        self._seen, self._fail = seen, fail

    def new_input(self, location: str) -> InputFile:
        self._seen.append(location)
        if self._fail and location.endswith(".avro") and not is_manifest_list(location):
            raise OSError("the store refused the manifest")
        return super().new_input(location)


def recording_cache(seen: list[str], fail: bool = False) -> TaskCache:
    return TaskCache(metadata_io=lambda io: RecordingIO(io, seen, fail))


def is_manifest_list(location: str) -> bool:
    return location.rsplit("/", 1)[-1].startswith("snap-")


def test_a_deferred_bare_count_reads_the_manifest_list_only(provider: LocalProvider) -> None:
    seen: list[str] = []
    plan = plan_scan(provider.load_table(NUMBERS), columns=None, cache=recording_cache(seen), defer_tasks=True)
    assert seen == []  # nothing read at planning time
    assert exact_row_count(plan) == TOTAL
    assert len(seen) == 1 and is_manifest_list(seen[0])
    assert plan.task_source.planned() is None  # the manifests were never read


def test_a_repeated_deferred_count_reads_no_manifest_list_again(provider: LocalProvider) -> None:
    seen: list[str] = []
    cache = recording_cache(seen)
    loaded = provider.load_table(NUMBERS)
    assert exact_row_count(plan_scan(loaded, columns=None, cache=cache, defer_tasks=True)) == TOTAL
    assert len(seen) == 1
    again = plan_scan(provider.load_table(NUMBERS), columns=None, cache=cache, defer_tasks=True)
    assert exact_row_count(again) == TOTAL and len(seen) == 1  # the list's count is kept with the plan cache
    fresh = plan_scan(loaded, columns=None, cache=recording_cache(seen), defer_tasks=True)
    assert exact_row_count(fresh) == TOTAL and len(seen) == 2  # another session's cache keeps nothing of it


def test_the_deferred_tasks_are_exactly_the_eager_ones(provider: LocalProvider) -> None:
    loaded = provider.load_table(NUMBERS)
    for pushdown in (AlwaysTrue(), parse("id < 10")):
        eager = plan_scan(loaded, columns=None, pushdown=pushdown)
        deferred = plan_scan(loaded, columns=None, pushdown=pushdown, defer_tasks=True)
        assert [t.file.file_path for t in deferred.tasks] == [t.file.file_path for t in eager.tasks]
        assert (deferred.files_planned, deferred.records_planned) == (eager.files_planned, eager.records_planned)


def test_delete_files_fall_back_to_the_manifests_and_to_no_answer(provider: LocalProvider) -> None:
    seen: list[str] = []
    plan = plan_scan(provider.load_table(DELETED), columns=None, cache=recording_cache(seen), defer_tasks=True)
    assert plan.task_source.listed_row_count() is None  # a delete manifest: the list alone cannot tell
    assert exact_row_count(plan) is None  # ... and the planned tasks carry delete files
    assert plan.delete_files == 1 and len(seen) > 1  # the manifests were read for it


def test_a_kept_plan_answers_without_any_read(provider: LocalProvider) -> None:
    seen: list[str] = []
    cache = recording_cache(seen)
    loaded = provider.load_table(NUMBERS)
    plan_scan(loaded, columns=None, cache=cache)  # eager: reads the manifest list and the manifests
    seen.clear()
    deferred = plan_scan(loaded, columns=None, cache=cache, defer_tasks=True)
    assert exact_row_count(deferred) == TOTAL and seen == [] and cache.hits == 1


def test_a_deferred_planning_failure_is_the_same_typed_error(provider: LocalProvider) -> None:
    loaded = provider.load_table(NUMBERS)
    with pytest.raises(QueryError, match=r"^cannot read the metadata of wh\.ns\.numbers"):
        plan_scan(loaded, columns=None, cache=recording_cache([], fail=True))  # eager: fails at planning
    deferred = plan_scan(loaded, columns=None, cache=recording_cache([], fail=True), defer_tasks=True)
    assert exact_row_count(deferred) == TOTAL  # the manifest list alone answers; no manifest is read
    with pytest.raises(QueryError, match=r"^cannot read the metadata of wh\.ns\.numbers"):
        deferred.tasks  # noqa: B018 - first use plans, and fails the same way


def test_only_a_bare_count_defers() -> None:
    assert may_count_from_metadata("SELECT count(*) FROM ns.t")
    assert may_count_from_metadata("select COUNT( * ) as n from wh.ns.t;")
    for sql in ("SELECT count(*) FROM ns.t WHERE id > 1", "SELECT count(id) FROM ns.t", "SELECT * FROM ns.t"):
        assert not may_count_from_metadata(sql)


def test_the_listed_count_is_read_once_per_plan(provider: LocalProvider) -> None:
    """A prepared bare count executes its one plan again: the manifest list is not read again."""
    seen: list[str] = []
    plan = plan_scan(provider.load_table(NUMBERS), columns=None, cache=recording_cache(seen), defer_tasks=True)
    assert [exact_row_count(plan) for _ in range(3)] == [TOTAL] * 3
    assert len(seen) == 1
