"""The required row filter against an independent reference, over tables of many files and partitions.

Each table is written file by file (one append per group of rows), so file pruning (manifest bounds, partition
values) and row-group pruning (Parquet statistics) both see groups whose statistics differ from the rows'
values: NaN is left out of min/max, a group may hold one value beside NULLs or NaNs, string bounds are truncated
to 16 characters, timestamps before 1970 land in partitions whose transform rounds toward negative infinity.
Pruning must never drop a row the filter keeps, and the exact filter must still drop every row it does not.

The reference evaluates the expressions spec's two-valued logic over every raw row in plain Python, with none
of SQE's code: a comparison with NULL or NaN is false, ``not-*`` forms and ``not`` are exact negations, strings
compare as UTF-8 bytes. SQE's answer (the rows and ``count(*)``) must equal it exactly.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import math
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from pydantic import SecretStr
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform, DayTransform, MonthTransform, Transform, TruncateTransform
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, StructType, TimestampType

import sqe.api
from sqe.config import CatalogConfig, SQEConfig, StorageConfig
from sqe_catalog.cli import main as catalog_cli

if TYPE_CHECKING:
    from sqe.session import Session
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = pytest.mark.e2e

Row = dict[str, Any]
Node = Any  # a required-row-filter in the REST JSON form


# ---------------------------------------------------------------------------------------------------------
# The reference: two-valued logic over raw Python values


def reference_keeps(node: Node, row: Row, names: dict[int, str]) -> bool:
    if isinstance(node, bool):
        return node
    kind = node["type"]
    if kind in ("and", "or"):
        left, right = reference_keeps(node["left"], row, names), reference_keeps(node["right"], row, names)
        return (left and right) if kind == "and" else (left or right)
    if kind == "not":
        return not reference_keeps(node["child"], row, names)
    column = node["child"] if "child" in node else node["left"]
    value = row[names[column["id"]]]
    absent = value is None or (isinstance(value, float) and math.isnan(value))
    if kind in ("is-null", "not-null"):
        return (value is None) == (kind == "is-null")
    if kind in ("is-nan", "not-nan"):
        is_nan = isinstance(value, float) and math.isnan(value)
        return is_nan == (kind == "is-nan")
    if kind in ("in", "not-in"):
        found = not absent and any(_ordered(value) == _ordered(v) for v in node["values"])
        return found == (kind == "in")
    literal = node["right"]
    if kind in ("starts-with", "not-starts-with"):
        found = not absent and str(value).encode().startswith(str(literal).encode())
        return found == (kind == "starts-with")
    if kind == "not-eq":
        return absent or _ordered(value) != _ordered(literal)
    if absent:
        return False
    left, right = _ordered(value), _ordered(literal)
    return {
        "eq": left == right,
        "lt": left < right,
        "lt-eq": left <= right,
        "gt": left > right,
        "gt-eq": left >= right,
    }[kind]


def _ordered(value: Any) -> Any:
    """Strings as UTF-8 bytes (the spec's order); timestamps as written (ISO text of one width sorts as time)."""
    return value.encode() if isinstance(value, str) else value


def compare(column: int, kind: str, literal: Any) -> Node:
    return {"type": kind, "left": {"type": "reference", "id": column}, "right": literal}


def check(column: int, kind: str) -> Node:
    return {"type": kind, "child": {"type": "reference", "id": column}}


def members(column: int, kind: str, values: list[Any]) -> Node:
    return {"type": kind, "child": {"type": "reference", "id": column}, "values": values}


def negated(node: Node) -> Node:
    return {"type": "not", "child": node}


# ---------------------------------------------------------------------------------------------------------
# The harness: a writer appends file by file, an admin restricts a reader, the reader's SQE session queries


@dataclass
class Lake:
    server: CatalogServer
    writer: CatalogPrincipal
    reader: CatalogPrincipal  # the restricted end user
    engine: CatalogPrincipal  # the trusted reader acting for it
    workdir: Path
    namespace: str

    def catalog(self) -> RestCatalog:
        return RestCatalog(
            "row-filter-reference-writer",
            uri=self.server.url,
            warehouse=self.server.warehouse,
            credential=self.writer.credential,
            scope="PRINCIPAL_ROLE:ALL",
            **{"header.X-Iceberg-Access-Delegation": "vended-credentials"},
        )

    def create(
        self, name: str, schema: Schema, files: Sequence[Sequence[Row]], spec: PartitionSpec | None = None
    ) -> None:
        """Table ``name`` with one append (one snapshot, at least one data file) per group of rows."""
        catalog = self.catalog()
        if spec is None:
            table = catalog.create_table((self.namespace, name), schema=schema)
        else:
            table = catalog.create_table((self.namespace, name), schema=schema, partition_spec=spec)
        arrow = table.schema().as_arrow()
        for rows in files:
            table.append(pa.Table.from_pylist(list(rows), schema=arrow))

    def restrict(self, table: str, row_filter: Node) -> None:
        path = self.workdir / f"{table}.json"
        path.write_text(json.dumps({"required-row-filter": row_filter}), encoding="utf-8")
        command = ["admin", "--config", str(self.server.config_path), "set-restrictions"]
        command += ["--warehouse", self.server.warehouse, "--namespace", self.namespace, "--table", table]
        command += ["--principal", self.reader.name, "--file", str(path)]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = catalog_cli(command)
        assert code == 0, err.getvalue()

    def session(self) -> Session:
        moto = self.server.moto
        catalog = CatalogConfig(
            uri=self.server.url,
            warehouse=self.server.warehouse,
            client_id=self.reader.client_id,
            client_secret=SecretStr(self.reader.client_secret),
            reader_client_id=self.engine.client_id,
            reader_client_secret=SecretStr(self.engine.client_secret),
            access_delegation="vended-credentials",
            require_vended_credentials=True,
        )
        storage = StorageConfig(endpoint=moto.url, region=moto.region, path_style=True)
        return sqe.api.connect(SQEConfig(catalog=catalog, storage=storage))

    def mismatches(
        self, table: str, rows: Sequence[Row], names: dict[int, str], filters: Sequence[Node]
    ) -> list[tuple[Node, list[int], list[int]]]:
        """(filter, SQE's ids, the reference's ids) for every filter whose answer differs, count(*) included."""
        found = []
        with self.session() as session:
            for row_filter in filters:
                self.restrict(table, row_filter)  # a new restriction changes the table's ETag: the next load sees it
                expected = sorted(row["id"] for row in rows if reference_keeps(row_filter, row, names))
                ids = session.sql(f"SELECT id FROM {self.namespace}.{table}").arrow().column("id").to_pylist()
                count = session.sql(f"SELECT count(*) AS n FROM {self.namespace}.{table}").arrow()["n"][0].as_py()
                if sorted(ids) != expected or count != len(expected):
                    found.append((row_filter, sorted(ids), expected))
        return found


@pytest.fixture(scope="module")
def lake(
    catalog_server: CatalogServer, tmp_path_factory: pytest.TempPathFactory, catalog_reader: CatalogPrincipal
) -> Iterator[Lake]:
    suffix = uuid.uuid4().hex[:6]
    grants = [(p, None, None) for p in ("NAMESPACE_FULL_METADATA", "TABLE_CREATE", "TABLE_WRITE_DATA")]
    writer = catalog_server.principal_with_grants(f"rfr_writer_{suffix}", grants)
    reader = catalog_server.principal_with_grants(f"rfr_reader_{suffix}", [("TABLE_READ_DATA", None, None)])
    with pytest.MonkeyPatch.context() as env:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            env.delenv(name, raising=False)
        env.setenv("AWS_EC2_METADATA_DISABLED", "true")
        workdir = tmp_path_factory.mktemp("row-filter-reference")
        world = Lake(catalog_server, writer, reader, catalog_reader, workdir, f"row_filter_ref_{suffix}")
        world.catalog().create_namespace(world.namespace)
        yield world


def numbered(groups: Sequence[Sequence[Row]]) -> list[list[Row]]:
    """The groups with ids 0, 1, 2, ... across all of them."""
    numbered_groups, next_id = [], 0
    for group in groups:
        numbered_groups.append([{"id": next_id + i, **row} for i, row in enumerate(group)])
        next_id += len(group)
    return numbered_groups


NAN = float("nan")


# ---------------------------------------------------------------------------------------------------------
# double: NaN beside one value (min = max in the statistics), NULLs, signed zeros, infinities


def test_double_filters_over_many_files_equal_the_reference(lake: Lake) -> None:
    groups = [
        [NAN, 1.0],
        [None, 1.0],
        [-0.0, -0.0],
        [0.0, 2.0],
        [math.inf, -math.inf],
        [NAN, NAN],
        [None],
        [3.0, 3.0, NAN],
    ]
    files = numbered([[{"x": value} for value in group] for group in groups])
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "x", DoubleType(), required=False))
    lake.create("doubles", schema, files)
    filters = [
        check(2, "is-nan"),
        check(2, "not-nan"),
        negated(check(2, "is-nan")),
        negated(check(2, "not-nan")),
        check(2, "is-null"),
        *(compare(2, kind, value) for kind in ("eq", "not-eq", "lt", "gt-eq") for value in (1.0, 3.0, 0.0, -0.0)),
        *(negated(compare(2, kind, 1.5)) for kind in ("lt", "lt-eq", "gt", "gt-eq", "eq")),
        members(2, "in", [0.0, 3.0]),
        members(2, "not-in", [1.0]),
        {"type": "or", "left": check(2, "is-nan"), "right": compare(2, "gt", 2.0)},
        {"type": "and", "left": check(2, "not-nan"), "right": negated(compare(2, "eq", 1.0))},
    ]
    rows = [row for group in files for row in group]
    assert lake.mismatches("doubles", rows, {1: "id", 2: "x"}, filters) == []


# ---------------------------------------------------------------------------------------------------------
# string: non-ASCII and supplementary-plane text, empty strings and prefixes, bounds truncated to 16 characters


def test_string_filters_over_many_files_equal_the_reference(lake: Lake) -> None:
    long_a = "a" * 24
    long_e = "é" * 22
    groups = [
        ["é", "e"],
        ["", None],
        ["abc", "abc"],
        ["\U0001f600", "\uffff"],
        [long_a + "z", long_a[:-1] + "b"],
        [long_e + "é", long_e + "\uffff"],
        [None, None],
        ["ab", "ab"],
    ]
    files = numbered([[{"s": value} for value in group] for group in groups])
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "s", StringType(), required=False))
    lake.create("strings", schema, files)
    prefixes = ["", "é", "ab", "abc", long_a, long_e + "\uffff", "\U0001f600"]
    filters = [
        *(compare(2, kind, prefix) for kind in ("starts-with", "not-starts-with") for prefix in prefixes),
        *(compare(2, kind, value) for kind in ("lt", "lt-eq", "gt", "not-eq") for value in ("", "é", "\uffff", "abc")),
        negated(compare(2, "starts-with", "ab")),
        members(2, "not-in", ["abc", "ab"]),
        members(2, "in", ["", "é"]),
    ]
    rows = [row for group in files for row in group]
    assert lake.mismatches("strings", rows, {1: "id", 2: "s"}, filters) == []


# ---------------------------------------------------------------------------------------------------------
# partitioned: time transforms around the epoch, truncate and bucket


TIMES = [
    dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
    dt.datetime(1970, 1, 1),
    dt.datetime(1969, 12, 31),
    dt.datetime(1969, 11, 30, 12),
    dt.datetime(1968, 12, 31, 23),
    dt.datetime(1970, 1, 1, 0, 0, 0, 1),
    None,
    dt.datetime(1969, 12, 1),
    dt.datetime(1969, 1, 1),
]
TEXTS = ["ab", "abc", "a", "ba", "é", "", None, "abd", "éa"]
NUMBERS = [1, 2, 3, 4, 5, None, 7, 8, 9]


@pytest.mark.parametrize("time_transform", [DayTransform(), MonthTransform()], ids=["day", "month"])
def test_partitioned_filters_equal_the_reference(lake: Lake, time_transform: Transform[Any, Any]) -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "ts", TimestampType(), required=False),
        NestedField(3, "s", StringType(), required=False),
        NestedField(4, "n", LongType(), required=False),
    )
    spec = PartitionSpec(
        PartitionField(2, 1000, time_transform, "ts_part"),
        PartitionField(3, 1001, TruncateTransform(2), "s_part"),
        PartitionField(4, 1002, BucketTransform(4), "n_part"),
    )
    rows = [{"id": i, "ts": ts, "s": s, "n": n} for i, (ts, s, n) in enumerate(zip(TIMES, TEXTS, NUMBERS, strict=True))]
    name = f"partitioned_{time_transform}"
    lake.create(name, schema, [rows], spec)  # one append: a file per partition
    iso = [time.isoformat(timespec="microseconds") for time in TIMES if time is not None]
    filters = [
        *(compare(2, kind, value) for kind in ("lt", "lt-eq", "gt", "gt-eq", "eq", "not-eq") for value in iso[:5]),
        members(2, "not-in", [iso[2]]),
        *(compare(3, kind, p) for kind in ("starts-with", "not-starts-with") for p in ("", "a", "ab", "abc", "é")),
        *(compare(4, kind, value) for kind in ("eq", "not-eq", "lt") for value in (3, 7)),
        members(4, "not-in", [3, 7]),
    ]
    as_text = [
        {**row, "ts": None if row["ts"] is None else row["ts"].isoformat(timespec="microseconds")} for row in rows
    ]
    assert lake.mismatches(name, as_text, {1: "id", 2: "ts", 3: "s", 4: "n"}, filters) == []


# ---------------------------------------------------------------------------------------------------------
# nested: a required field inside an optional struct is null wherever the struct is


def test_nested_filters_over_many_files_equal_the_reference(lake: Lake) -> None:
    city_zip = StructType(
        NestedField(3, "city", StringType(), required=False), NestedField(4, "zip", LongType(), required=True)
    )
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "addr", city_zip, required=False))
    groups: list[list[Any]] = [
        [None, None],
        [{"city": None, "zip": 2}, None],
        [{"city": "Paris", "zip": 1}, {"city": "Paris", "zip": 1}],
        [{"city": "Rome", "zip": 2}],
        [None, {"city": "Rome", "zip": 3}],
    ]
    files = numbered([[{"addr": value} for value in group] for group in groups])
    lake.create("nested", schema, files)
    filters = [
        *(compare(4, kind, 2) for kind in ("eq", "not-eq", "lt")),
        negated(compare(4, "gt", 1)),
        members(4, "not-in", [1, 2]),
        *(check(field, kind) for field in (2, 3, 4) for kind in ("is-null", "not-null")),
        *(compare(3, kind, "Paris") for kind in ("eq", "not-eq", "not-starts-with")),
    ]
    rows = [
        {"id": row["id"], "addr": row["addr"], **{key: (row["addr"] or {}).get(key) for key in ("city", "zip")}}
        for group in files
        for row in group
    ]
    assert lake.mismatches("nested", rows, {1: "id", 2: "addr", 3: "city", 4: "zip"}, filters) == []
