"""A table partitioned by a double column is planned with its partition values exact.

pyiceberg 0.12's compiled Avro decoder reads an Avro double as a 32-bit float (0.1 became 0.10000000149011612),
so planning pruned the file holding ``x = 0.1`` and the query returned no row. SQE decodes every Avro value
through ``sqe.planning.avro_decoder``, which reads doubles as 64-bit floats. Real sqe-catalog and moto; the
table is written by pyiceberg, as any writer's would be.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DoubleType, LongType, NestedField

from sqe.execution.cache import clear_process_caches
from tests.conftest import pyiceberg_catalog
from tests.e2e.test_engine_range_cache import session_for

if TYPE_CHECKING:
    from pathlib import Path

    from tests.conftest import CatalogServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]


def test_a_filter_on_a_double_partition_column_finds_its_rows(catalog_server: CatalogServer, tmp_path: Path) -> None:
    ns = f"dblpart_{uuid.uuid4().hex[:6]}"
    catalog = pyiceberg_catalog(catalog_server, catalog_server.admin)
    catalog.create_namespace(ns)
    schema = Schema(NestedField(1, "x", DoubleType(), required=False), NestedField(2, "id", LongType(), required=False))
    spec = PartitionSpec(PartitionField(1, 1000, IdentityTransform(), "x"))
    table = catalog.create_table((ns, "t"), schema=schema, partition_spec=spec)
    table.append(pa.table({"x": pa.array([0.1, 0.2, 0.1], pa.float64()), "id": pa.array([1, 2, 3], pa.int64())}))
    clear_process_caches()
    with session_for(tmp_path, catalog_server, catalog_server.admin) as session:
        assert session.sql(f"SELECT id FROM {ns}.t WHERE x = 0.1 ORDER BY id").fetchall() == [(1,), (3,)]
        assert session.sql(f"SELECT count(*) FROM {ns}.t WHERE x = 0.2").fetchall() == [(1,)]
        assert session.sql(f'SELECT "partition" FROM {ns}."t$files" ORDER BY 1').fetchall() == [
            ({"x": 0.1},),
            ({"x": 0.2},),
        ]
