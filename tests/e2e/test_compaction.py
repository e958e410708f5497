"""OPTIMIZE (local compaction) against real moto + sqe-catalog with vended write credentials: 200 small files
become few with the same rows, one ``replace`` snapshot; a concurrent delete of an input, or of rows of an input,
fails the compaction and removes its outputs; a concurrent append survives."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from pyiceberg.expressions import AlwaysTrue, EqualTo

import sqe.api
from sqe.errors import CompactionConflictError, QueryError
from sqe.execution.compaction import commit_replace, plan_bins, rewrite_bin
from sqe.execution.write_target import writable_table
from sqe.session import Session
from tests.conftest import pyiceberg_catalog, write_sqe_config
from tests.unit.sqe.iceberg_local import add_positional_deletes

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import FileScanTask

    from sqe.catalog.base import LoadedTable
    from tests.conftest import CatalogPrincipal, CatalogServer, MotoServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])


def small_files_table(server: CatalogServer, writer: CatalogPrincipal, files: int) -> tuple[str, Any]:
    """A table of ``files`` one-to-five-row files, added in one commit (written with the catalog's own key)."""
    moto: MotoServer = server.moto
    namespace = f"opt_{uuid.uuid4().hex[:6]}"
    catalog = pyiceberg_catalog(server, writer)
    catalog.create_namespace(namespace)
    table = catalog.create_table(f"{namespace}.t", SCHEMA)
    fs = pafs.S3FileSystem(
        access_key=moto.access_key_id,
        secret_key=moto.secret_access_key,
        endpoint_override=moto.url,
        region=moto.region,
    )
    paths = []
    for i in range(files):
        ids = list(range(i * 5, i * 5 + 1 + i % 5))
        path = f"{table.location().removeprefix('s3://')}/data/small-{i:04d}.parquet"
        pq.write_table(pa.table({"id": ids, "name": [f"n{v}" for v in ids]}, schema=SCHEMA), path, filesystem=fs)
        paths.append("s3://" + path)
    table.add_files(paths)
    return f"{namespace}.t", catalog.load_table(f"{namespace}.t")


def connect(tmp_path: Path, server: CatalogServer, principal: CatalogPrincipal) -> Session:
    return sqe.api.connect(write_sqe_config(tmp_path / "sqe.toml", server.url, principal, server.moto))


def fingerprint(session: Session, name: str) -> list[Any]:
    return session.sql(f"SELECT count(*), sum(id), sum(hash(id, name)) FROM {name}").fetchall()


def rewritten_uncommitted(session: Session, name: str) -> tuple[LoadedTable, list[FileScanTask], list[DataFile]]:
    """OPTIMIZE's steps up to its commit: the table as loaded, the tasks read and the new files written."""
    loaded = session._provider.load_table(session.resolve_name(tuple(name.split("."))), bypass_cache=True)
    bins = list(plan_bins(loaded.table, AlwaysTrue(), 64 * 1024 * 1024))
    table = writable_table(loaded)  # as OPTIMIZE rewrites: data files through the table's own FileIO
    outputs = [f for group in bins for f in rewrite_bin(table, group, 64 * 1024 * 1024)]
    return loaded, [task for group in bins for task in group], outputs


def test_two_hundred_small_files_become_few_with_the_same_rows(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    name, table = small_files_table(catalog_server, engine_writer, 200)
    assert len(list(table.scan().plan_files())) == 200
    with connect(tmp_path, catalog_server, engine_writer) as s:
        before = fingerprint(s, name)
        result = s.sql(f"OPTIMIZE {name} WITH (target_file_size = 64 * 1024 * 1024)").arrow().to_pylist()[0]
        assert result["rewritten_files"] == 200 and 1 <= result["added_files"] <= 3
        assert fingerprint(s, name) == before
    table.refresh()
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary.operation.value == "replace"
    assert len(list(table.scan().plan_files())) == result["added_files"]


def test_concurrent_delete_of_an_input_fails_and_removes_outputs(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    name, table = small_files_table(catalog_server, engine_writer, 6)
    with connect(tmp_path, catalog_server, engine_writer) as s:
        loaded, inputs, outputs = rewritten_uncommitted(s, name)
        table.delete(EqualTo("id", 0))  # another writer removes small-0000 (its only row) meanwhile
        with pytest.raises(CompactionConflictError, match="a concurrent commit removed 1 of its input files"):
            commit_replace(loaded, s._provider, inputs, outputs)
        for output in outputs:
            assert not loaded.table.io.new_input(output.file_path).exists()
    table.refresh()
    assert table.current_snapshot().summary.operation.value != "replace"  # type: ignore[union-attr]


def test_concurrent_row_delete_on_an_input_fails_instead_of_bringing_the_rows_back(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    # Found by review: pyiceberg's own commit retry let the replace through, and the outputs (read before the
    # delete) put the deleted row back.
    name, table = small_files_table(catalog_server, engine_writer, 6)
    with connect(tmp_path, catalog_server, engine_writer) as s:
        loaded, inputs, outputs = rewritten_uncommitted(s, name)
        add_positional_deletes(table, (0,))  # a merge-on-read DELETE of one row of an input, by another engine
        s._provider.invalidate(loaded.ident)
        after_delete = fingerprint(s, name)
        with pytest.raises(
            CompactionConflictError, match=r"a concurrent commit deleted rows from \d+ of its input files"
        ):
            commit_replace(loaded, s._provider, inputs, outputs)
        for output in outputs:
            assert not loaded.table.io.new_input(output.file_path).exists()
        s._provider.invalidate(loaded.ident)
        assert fingerprint(s, name) == after_delete
        # run again on the new state, OPTIMIZE applies the delete and keeps it applied
        s.sql(f"OPTIMIZE {name} WITH (target_file_size = 64 * 1024 * 1024)").arrow()
        assert fingerprint(s, name) == after_delete


def test_concurrent_append_survives(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    name, table = small_files_table(catalog_server, engine_writer, 6)
    with connect(tmp_path, catalog_server, engine_writer) as s:
        before = fingerprint(s, name)[0]
        loaded, inputs, outputs = rewritten_uncommitted(s, name)
        table.append(pa.table({"id": [1000], "name": ["late"]}, schema=SCHEMA))
        commit_replace(loaded, s._provider, inputs, outputs)
        s._provider.invalidate(loaded.ident)
        after = fingerprint(s, name)[0]
        assert after[0] == before[0] + 1 and after[1] == before[1] + 1000
        assert s.sql(f"SELECT name FROM {name} WHERE id = 1000").fetchall() == [("late",)]


def test_where_must_name_partition_columns(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    name, _ = small_files_table(catalog_server, engine_writer, 2)
    with (
        connect(tmp_path, catalog_server, engine_writer) as s,
        pytest.raises(QueryError, match="WHERE may only name identity partition columns"),
    ):
        s.sql(f"OPTIMIZE {name} WHERE id = 1")
