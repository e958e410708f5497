"""The task cache keeps projected schemas per metadata file, snapshot and columns; a new revision projects anew."""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.types import LongType

from sqe.catalog.base import TableIdent
from sqe.planning.planner import TaskCache, plan_scan
from tests.unit.sqe.iceberg_local import LocalProvider

NUMBERS = TableIdent("wh", ("ns",), "numbers")


def test_a_repeat_plan_reuses_the_projection_of_the_same_metadata_and_columns(provider: LocalProvider) -> None:
    cache = TaskCache()
    first = plan_scan(provider.load_table(NUMBERS), columns=["id"], cache=cache)
    again = plan_scan(provider.load_table(NUMBERS), columns=["id"], cache=cache)
    assert again.read.projected_schema is first.read.projected_schema
    assert again.read.io is not None and again.loaded is not first.loaded  # io and table are this load's own
    other = plan_scan(provider.load_table(NUMBERS), columns=None, cache=cache)
    assert other.read.projected_schema is not first.read.projected_schema
    assert len(other.read.projected_schema.columns) > len(first.read.projected_schema.columns) == 1


def test_a_new_revision_projects_its_own_schema(write_provider: LocalProvider) -> None:
    ident = TableIdent("wh", ("ns",), "evolving")
    write_provider.create_table(ident, pa.schema([("a", pa.int64())]))
    cache = TaskCache()
    before = plan_scan(write_provider.load_table(ident), columns=None, cache=cache)
    table = write_provider.load_table(ident).table
    with table.update_schema() as update:
        update.add_column("b", LongType())
    after = plan_scan(write_provider.load_table(ident), columns=None, cache=cache)
    assert [f.name for f in before.read.projected_schema.columns] == ["a"]
    assert [f.name for f in after.read.projected_schema.columns] == ["a", "b"]


def test_without_a_cache_every_plan_projects(provider: LocalProvider) -> None:
    first = plan_scan(provider.load_table(NUMBERS), columns=["id"])
    again = plan_scan(provider.load_table(NUMBERS), columns=["id"])
    assert again.read.projected_schema == first.read.projected_schema
    assert again.read.projected_schema is not first.read.projected_schema
