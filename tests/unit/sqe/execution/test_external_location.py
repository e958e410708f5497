"""``CREATE EXTERNAL TABLE``'s LOCATION is an object-store location by the one scheme rule (``sqe.locations``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import duckdb
import pytest

from sqe.catalog.base import TableIdent
from sqe.errors import NoSuchTableError, QueryError
from sqe.execution.external import ExternalSources
from sqe.planning.external_sql import CreateExternal


class _NoTables:
    def default_warehouse(self) -> str:
        return "w"

    def load_table(self, ident: TableIdent) -> Any:
        raise NoSuchTableError(f"no table {ident}")


def _create(location: str) -> None:
    def resolve(parts: Sequence[str]) -> TableIdent:
        return TableIdent("w", tuple(parts[:-1]), parts[-1])

    sources = ExternalSources(None, _NoTables(), duckdb.connect(), duckdb.connect(), resolve)  # type: ignore[arg-type]
    # own keys: no governed-location lookup; no config: the store is missing, the step after the location check
    keys = {"access_key_id": "AK", "secret_access_key": "SK"}
    sources.run_statement(CreateExternal(("ext", "t"), (), (), "parquet", location, keys))


@pytest.mark.parametrize("location", ["s3://b/p", "S3://b/p", "s3a://b/p", "S3N://b/p/"])
def test_object_store_locations_pass_the_location_check(location: str) -> None:
    with pytest.raises(QueryError, match="external tables need an SQE config"):
        _create(location)


@pytest.mark.parametrize("location", ["gs://b/p", "file:///tmp/p", "/tmp/p", "s3:/b/p"])
def test_other_locations_are_refused(location: str) -> None:
    with pytest.raises(QueryError, match=r"LOCATION must be an s3:// prefix"):
        _create(location)
