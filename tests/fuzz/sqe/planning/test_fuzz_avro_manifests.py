"""Fuzz SQE's bounded reading of manifest lists and manifests (``sqe.planning.avro_limits``, ``avro_decoder``,
``manifests``) with structure-aware mutations of real files pyiceberg wrote, in a child process.

pyiceberg's compiled Avro decoder reads past its buffer when a file states a length past it; SQE checks each
container's framing and schema and bounds every read. Every mutated file must be refused, fail as a manifest
that does not decode, or decode values that all lie in the file: never crash, hang or read outside it. The
mutations are seeded, but the files pyiceberg writes differ per run (sync markers, snapshot ids, paths), so case N
mutates other bytes each run: the input of the case running is kept as ``current-case.avro`` in the written
directory (a crash leaves it there), and each with a bad outcome as ``case-N.avro``. ``SQE_FUZZ_CASES`` runs more
locally.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform, IdentityTransform
from pyiceberg.types import IntegerType, ListType, LongType, NestedField, StringType, StructType

from tests.fuzz.subprocess_cases import run_cases
from tests.unit.sqe.iceberg_local import local_catalog

if TYPE_CHECKING:
    from pathlib import Path

CASES = int(os.environ.get("SQE_FUZZ_CASES", "240"))
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "name", StringType(), required=False),
    NestedField(3, "point", StructType(NestedField(4, "x", IntegerType(), required=False)), required=False),
    NestedField(5, "tags", ListType(6, StringType(), element_required=False), required=False),
)
SPEC = PartitionSpec(
    PartitionField(2, 1000, IdentityTransform(), "name"), PartitionField(1, 1001, BucketTransform(4), "id_bucket")
)


def _rows(schema: Schema, start: int) -> pa.Table:
    """Rows of ``schema`` (the table's: its field ids assigned anew by the catalog)."""
    rows = [{"id": i, "name": f"n{i % 2}", "point": {"x": i}, "tags": ["t", f"é{i}"]} for i in range(start, start + 4)]
    return pa.Table.from_pylist(rows, schema=schema.as_arrow())


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Manifest lists (format v1 and v2; null, deflate and zstd codecs, partitioned, with column stats) and the
    manifests they name, each list copied into the directory returned."""
    root = tmp_path_factory.mktemp("manifests")
    catalog = local_catalog(root, "wh")
    catalog.create_namespace("ns")
    for version, codec in [(1, "null"), (2, "gzip"), (2, "zstd")]:
        properties = {"format-version": str(version), "write.avro.compression-codec": codec}
        table = catalog.create_table(f"ns.t{version}{codec}", SCHEMA, partition_spec=SPEC, properties=properties)
        for start in (0, 10):
            table.append(_rows(table.schema(), start))
        snapshot = table.current_snapshot()
        assert snapshot is not None
        data = table.io.new_input(snapshot.manifest_list).open().read()
        (root / f"v{version}-{codec}.list.avro").write_bytes(data)
    return root


def test_mutated_manifests_are_refused_undecodable_or_decoded_from_the_file(written: Path) -> None:
    outcomes = run_cases("tests.fuzz.sqe.planning.avro_cases", str(written), str(CASES))  # inputs kept in written
    assert len(outcomes) == CASES
    seen = Counter(outcomes.values())
    assert {"refused", "undecodable", "decoded"} <= set(seen), seen  # the cases reach every outcome
