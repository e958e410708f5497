"""Background planning: ``plan_scan(background=True)`` reads the manifests on another thread while its caller goes
on; the first use of the tasks waits for them, gets exactly the eager plan's tasks, or planning's typed error.
A statement waits for its scans' tasks before it returns, so it fails where it always failed."""

from __future__ import annotations

import contextvars
import threading
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.expressions.parser import parse
from pyiceberg.io import FileIO, InputFile

from sqe.catalog.base import TableIdent
from sqe.errors import QueryError
from sqe.planning.planner import TaskCache, plan_scan
from tests.helpers.read_only_io import ReadOnlyIO
from tests.unit.sqe.iceberg_local import LocalProvider, build_numbers

NUMBERS = TableIdent("wh", ("ns",), "numbers")
WHO = contextvars.ContextVar("who", default="nobody")


class GatedIO(ReadOnlyIO):
    """The table's FileIO, with each metadata read recorded (location, thread, context variable) and the
    manifests held back until ``gate`` is set; ``fail`` refuses them instead."""

    def __init__(self, inner: FileIO, seen: list[tuple[str, str, str]], gate: threading.Event, fail: bool) -> None:
        super().__init__(inner)
        self._seen, self._gate, self._fail = seen, gate, fail

    def new_input(self, location: str) -> InputFile:
        self._seen.append((location.rsplit("/", 1)[-1], threading.current_thread().name, WHO.get()))
        if not location.rsplit("/", 1)[-1].startswith("snap-"):  # a manifest, not the manifest list
            if not self._gate.wait(timeout=30):
                raise OSError("the test never opened the gate")
            if self._fail:
                raise OSError("the store refused the manifest")
        return super().new_input(location)


def gated_cache(seen: list[tuple[str, str, str]], gate: threading.Event, fail: bool = False) -> TaskCache:
    return TaskCache(metadata_io=lambda io: GatedIO(io, seen, gate, fail))


def test_plan_scan_returns_while_the_manifests_are_still_being_read(provider: LocalProvider) -> None:
    seen: list[tuple[str, str, str]] = []
    gate = threading.Event()
    loaded = provider.load_table(NUMBERS)
    plan = plan_scan(loaded, columns=None, pushdown=parse("id < 1500"), cache=gated_cache(seen, gate), background=True)
    assert plan.task_source.planned() is None  # returned with the manifests held back: planning is not done
    gate.set()
    eager = plan_scan(loaded, columns=None, pushdown=parse("id < 1500"))
    assert [t.file.file_path for t in plan.tasks] == [t.file.file_path for t in eager.tasks]
    # The manifest list is read on the planning thread (the manifests on pyiceberg's pool, as before).
    assert [thread for name, thread, _ in seen if name.startswith("snap-")] == ["sqe-plan"]


def test_a_background_failure_is_raised_by_the_first_use_as_the_same_typed_error(provider: LocalProvider) -> None:
    gate = threading.Event()
    gate.set()
    loaded = provider.load_table(NUMBERS)
    plan = plan_scan(loaded, columns=None, cache=gated_cache([], gate, fail=True), background=True)
    for _ in range(2):  # every use raises it, none sees an empty plan
        with pytest.raises(QueryError, match=r"^cannot read the metadata of wh\.ns\.numbers: the store refused"):
            plan.tasks  # noqa: B018


def test_the_planning_thread_runs_in_the_callers_context(provider: LocalProvider) -> None:
    seen: list[tuple[str, str, str]] = []
    gate = threading.Event()
    gate.set()
    token = WHO.set("alice")
    try:
        plan = plan_scan(provider.load_table(NUMBERS), columns=None, cache=gated_cache(seen, gate), background=True)
        assert plan.tasks
    finally:
        WHO.reset(token)
    # What SQE's planning thread reads (the manifest list) it reads as the caller; pyiceberg's own pool, which
    # reads the manifests, never had the caller's context variables, with or without the background.
    assert [who for name, _, who in seen if name.startswith("snap-")] == ["alice"]


def test_kept_tasks_start_no_thread_and_read_nothing(provider: LocalProvider) -> None:
    seen: list[tuple[str, str, str]] = []
    gate = threading.Event()
    gate.set()
    cache = gated_cache(seen, gate)
    loaded = provider.load_table(NUMBERS)
    first = plan_scan(loaded, columns=None, cache=cache, background=True)
    assert first.tasks and seen
    seen.clear()
    again = plan_scan(loaded, columns=None, cache=cache, background=True)
    assert again.task_source.planned() == first.tasks and seen == []  # known at once, from the task cache


def test_a_statement_fails_in_its_own_call_when_a_manifest_is_gone(
    write_provider: LocalProvider, session_factory: Any
) -> None:
    """The statement waits for its background planning before it returns: a missing manifest is the
    statement's typed error from ``sql()``, on the pass-through path and on DuckDB's alike."""
    table = build_numbers(write_provider.catalogs["wh"])
    snapshot = table.current_snapshot()
    assert snapshot is not None
    manifest = snapshot.manifests(table.io)[0].manifest_path
    Path(manifest.removeprefix("file://")).unlink()
    session = session_factory(write_provider)
    for sql in ("SELECT id FROM ns.numbers WHERE id < 5", "SELECT grp, count(*) FROM ns.numbers GROUP BY grp"):
        with pytest.raises(QueryError, match=r"^cannot read the metadata of wh\.ns\.numbers"):
            session.sql(sql)
