"""A real local Iceberg catalog (pyiceberg SqlCatalog, SQLite + file:// warehouse) behind SQE's TableProvider seam.

Not a mock: tables are real Iceberg tables with real manifests, Parquet data files and (hand-written, then
committed through pyiceberg's snapshot producer) positional delete files. Each warehouse is its own catalog.
"""

from __future__ import annotations

import datetime as dt
import json
import struct
import time
import uuid
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq
from pyiceberg.avro.file import AvroOutputFile
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, TableAlreadyExistsError
from pyiceberg.exceptions import NoSuchNamespaceError as IcebergNoSuchNamespace
from pyiceberg.exceptions import NoSuchTableError as IcebergNoSuchTable
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriterV2,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table, Transaction
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _FastAppendFiles
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import DateType, IntegerType, LongType, NestedField, StringType
from pyroaring import BitMap

from sqe.catalog.base import CacheOutcome, LoadedTable, TableIdent, ViewDefinition
from sqe.errors import CatalogError, NoSuchNamespaceError, NoSuchTableError, NoSuchViewError

ROWS_PER_FILE = 1000
NUMBER_FILES = 4
EVENT_GROUPS = 5
DELETED_POSITIONS = (0, 7, 999)

NUMBERS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("grp", pa.int32()),
    ]
)


class LocalProvider:
    """TableProvider over real SqlCatalogs; each load hands out the table with the catalog's local FileIO."""

    def __init__(self, root: Path, warehouses: tuple[str, ...] = ("wh", "wh2")) -> None:
        self.root = root
        self.catalogs = {name: local_catalog(root, name) for name in warehouses}
        self.loads: list[LoadedTable] = []
        self.credential_lifetime: float | None = 3600.0
        self.restrictions: dict[str, Mapping[str, Any]] = {}  # str(ident) -> raw read-restrictions
        self.invalidated: list[TableIdent] = []

    def default_warehouse(self) -> str:
        return next(iter(self.catalogs))

    def load_table(self, ident: TableIdent, *, bypass_cache: bool = False) -> LoadedTable:
        catalog = self._catalog_for(ident)
        try:
            table = catalog.load_table((*ident.namespace, ident.name))
        except (IcebergNoSuchTable, IcebergNoSuchNamespace):
            raise NoSuchTableError(f"table {ident} does not exist", status=404) from None
        return self._loaded(ident, table)

    def create_table(self, ident: TableIdent, schema: pa.Schema) -> LoadedTable:
        catalog = self._catalog_for(ident)
        catalog.create_namespace_if_not_exists(ident.namespace)
        try:
            table = catalog.create_table((*ident.namespace, ident.name), schema=schema)
        except TableAlreadyExistsError:
            raise CatalogError(f"table {ident} already exists", status=409) from None
        return self._loaded(ident, table)

    def list_tables(self, warehouse: str, namespace: tuple[str, ...] | None) -> list[TableIdent]:
        catalog = self.catalogs[warehouse]
        namespaces = [namespace] if namespace else catalog.list_namespaces()
        return [TableIdent(warehouse, tuple(i[:-1]), i[-1]) for ns in namespaces for i in catalog.list_tables(ns)]

    def invalidate(self, ident: TableIdent) -> None:
        self.invalidated.append(ident)

    # SqlCatalog keeps no views: there are none to load or list, and none can be made here.
    def load_view(self, ident: TableIdent) -> ViewDefinition:
        raise NoSuchViewError(f"view {ident} not found", 404)

    def list_views(self, warehouse: str, namespace: tuple[str, ...] | None) -> list[TableIdent]:
        return []

    def create_view(
        self, ident: TableIdent, schema: pa.Schema, sql: str, dialect: str, *, replace: bool = False
    ) -> None:
        raise CatalogError("the local test catalog keeps no views", status=501)

    def drop_view(self, ident: TableIdent) -> None:
        raise NoSuchViewError(f"view {ident} not found", 404)

    def scan_planning(self, warehouse: str) -> None:
        return None  # no REST endpoints: server-side planning is not advertised

    def load_table_credentials(self, ident: TableIdent) -> None:
        return None  # no REST endpoints: credentials are refreshed by reloading the table

    def drop_table(self, ident: TableIdent) -> None:
        try:
            self._catalog_for(ident).drop_table((*ident.namespace, ident.name))
        except (IcebergNoSuchTable, IcebergNoSuchNamespace):
            raise NoSuchTableError(f"table {ident} does not exist", status=404) from None

    def list_namespaces(self, warehouse: str, parent: tuple[str, ...] | None = None) -> list[tuple[str, ...]]:
        return [tuple(ns) for ns in self.catalogs[warehouse].list_namespaces(parent or ())]

    def create_namespace(self, warehouse: str, namespace: tuple[str, ...]) -> None:
        try:
            self.catalogs[warehouse].create_namespace(namespace)
        except NamespaceAlreadyExistsError:
            raise CatalogError(f"namespace {namespace} already exists", status=409) from None

    def drop_namespace(self, warehouse: str, namespace: tuple[str, ...]) -> None:
        try:
            self.catalogs[warehouse].drop_namespace(namespace)
        except IcebergNoSuchNamespace:
            raise NoSuchNamespaceError(f"namespace {namespace} does not exist", status=404) from None

    def _catalog_for(self, ident: TableIdent) -> SqlCatalog:
        catalog = self.catalogs.get(ident.warehouse)
        if catalog is None:
            raise NoSuchTableError(f"{ident}: unknown warehouse {ident.warehouse!r}", status=404)
        return catalog

    def _loaded(self, ident: TableIdent, table: Table) -> LoadedTable:
        now = time.time()
        lifetime = self.credential_lifetime
        raw: dict[str, Any] = {"metadata-location": table.metadata_location, "config": {}}
        if str(ident) in self.restrictions:
            raw["read-restrictions"] = self.restrictions[str(ident)]
        loaded = LoadedTable(
            ident=ident,
            table=table,
            io=table.io,
            credential_source="static",
            usable_until=None if lifetime is None else now + lifetime - 300,
            expires_at=None if lifetime is None else now + lifetime,
            cache_outcome=CacheOutcome.RELOADED,
            raw=raw,
            can_write=True,
        )
        self.loads.append(loaded)
        return loaded


def local_catalog(root: Path, warehouse: str) -> SqlCatalog:
    (root / warehouse).mkdir(parents=True, exist_ok=True)
    return SqlCatalog(
        warehouse, uri=f"sqlite:///{root / warehouse}/catalog.db", warehouse=f"file://{root / warehouse}/data"
    )


def numbers_batch(start: int, count: int) -> pa.Table:
    ids = list(range(start, start + count))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": [f"n{i}" for i in ids],
            "grp": pa.array([i % EVENT_GROUPS for i in ids], pa.int32()),
        },
        schema=NUMBERS_SCHEMA,
    )


def build_numbers(catalog: SqlCatalog, name: str = "ns.numbers") -> Table:
    """Unpartitioned, NUMBER_FILES files of ROWS_PER_FILE rows: ids 0..3999."""
    catalog.create_namespace_if_not_exists("ns")
    table = catalog.create_table(name, schema=NUMBERS_SCHEMA)
    for k in range(NUMBER_FILES):
        table.append(numbers_batch(k * ROWS_PER_FILE, ROWS_PER_FILE))
    return table


def build_many_batches(catalog: SqlCatalog) -> Table:
    """2 files of 1000 rows written in row groups of 50: 40 record batches, far more than a small queue."""
    catalog.create_namespace_if_not_exists("ns")
    table = catalog.create_table(
        "ns.many_batches", schema=NUMBERS_SCHEMA, properties={"write.parquet.row-group-limit": "50"}
    )
    for k in range(2):
        table.append(numbers_batch(k * ROWS_PER_FILE, ROWS_PER_FILE))
    return table


def build_events(catalog: SqlCatalog) -> Table:
    """Partitioned by identity(grp): one file per group, 400 rows each, with a date column."""
    catalog.create_namespace_if_not_exists("ns")
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "grp", IntegerType(), required=False),
        NestedField(3, "day", DateType(), required=False),
        NestedField(4, "label", StringType(), required=False),
    )
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="grp"))
    table = catalog.create_table("ns.events", schema=schema, partition_spec=spec)
    ids = list(range(2000))
    table.append(
        pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "grp": pa.array([i % EVENT_GROUPS for i in ids], pa.int32()),
                "day": [dt.date(2024, 1, 1) + dt.timedelta(days=i % EVENT_GROUPS) for i in ids],
                "label": [f"e{i}" for i in ids],
            },
            schema=table.schema().as_arrow(),
        )
    )
    return table


def add_positional_deletes(
    table: Table, positions: tuple[int, ...] = DELETED_POSITIONS, file_format: str = "parquet"
) -> str:
    """Delete rows of the table's first data file by position (a Parquet or ORC file); returns that file's path."""
    target = next(iter(table.scan().plan_files())).file.file_path
    path = f"{table.location()}/data/pos-del-{uuid.uuid4()}.{file_format}"
    buffer = pa.BufferOutputStream()
    rows = pa.table(
        {"file_path": [target] * len(positions), "pos": pa.array(positions, pa.int64())}, schema=POSITION_DELETE_SCHEMA
    )
    if file_format == "orc":
        orc.write_table(rows, buffer)
    else:
        pq.write_table(rows, buffer)
    written = buffer.getvalue().to_pybytes()
    with table.io.new_output(path).create() as out:  # the table's own FileIO: a local path or an object store
        out.write(written)
    delete_file = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat(file_format.upper()),
        partition=Record(),
        record_count=len(positions),
        file_size_in_bytes=len(written),
    )
    delete_file.spec_id = table.spec().spec_id
    with table.transaction() as tx:
        _AddPositionDeletes(tx, table, [delete_file]).commit()
    return target


def deletion_vector_puffin(referenced: str, bitmaps: Mapping[int, BitMap]) -> tuple[bytes, int, int]:
    """A Puffin file holding one ``deletion-vector-v1`` blob for ``referenced`` (each 64-bit position's high half
    a key of ``bitmaps``, as the spec frames it); the file, the blob's offset and length. Written from the spec."""
    vector = struct.pack("<Q", len(bitmaps))
    for key in sorted(bitmaps):
        vector += struct.pack("<I", key) + bitmaps[key].serialize()
    return vector_puffin(referenced, vector, sum(len(b) for b in bitmaps.values()))


def vector_puffin(referenced: str, vector: bytes, cardinality: int) -> tuple[bytes, int, int]:
    """:func:`deletion_vector_puffin` of a serialized 64-bit bitmap ``vector`` as given (well-formed or not)."""
    body = b"\xd1\xd3\x39\x64" + vector
    blob = struct.pack(">I", len(body)) + body + struct.pack(">I", zlib.crc32(body))
    meta = {"type": "deletion-vector-v1", "fields": [2147483645], "snapshot-id": -1, "sequence-number": -1}
    meta |= {"offset": 4, "length": len(blob)}
    meta["properties"] = {"referenced-data-file": referenced, "cardinality": str(cardinality)}
    footer = json.dumps({"blobs": [meta]}).encode()
    puffin = b"PFA1" + blob + b"PFA1" + footer + struct.pack("<I", len(footer)) + b"\0\0\0\0" + b"PFA1"
    return puffin, 4, len(blob)


def add_deletion_vector(table: Table, bitmaps: Mapping[int, BitMap]) -> str:
    """Delete rows of the table's first data file with a deletion vector (a Puffin file, committed in a v3 delete
    manifest); returns that file's path."""
    target = next(iter(table.scan().plan_files())).file.file_path
    add_deletion_vectors(table, {target: bitmaps})
    return target


def add_deletion_vectors(
    table: Table, vectors: Mapping[str, Mapping[int, BitMap]], stated_positions: Mapping[str, int] | None = None
) -> tuple[str, dict[str, tuple[int, int]]]:
    """Delete rows of several data files with deletion vectors in ONE Puffin file (one blob each, in the order
    given), committed in a v3 delete manifest, one entry each; ``stated_positions`` misstates an entry's
    cardinality (its ``record_count``). Returns the Puffin file's path and each data file's (offset, length)."""
    path = f"{table.location()}/data/dv-{uuid.uuid4()}.puffin"
    written, places = vectors_puffin(vectors)
    with table.io.new_output(path).create() as out:
        out.write(written)
    delete_files = []
    for referenced, bitmaps in vectors.items():
        offset, length = places[referenced]
        positions = sum(len(b) for b in bitmaps.values())
        delete_file = DataFile.from_args(
            3,  # a v3 record: a v2 one drops the referenced data file, content offset and size
            content=DataFileContent.POSITION_DELETES,
            file_path=path,
            file_format=FileFormat.PUFFIN,
            partition=Record(),
            record_count=(stated_positions or {}).get(referenced, positions),
            file_size_in_bytes=len(written),
            referenced_data_file=referenced,
            content_offset=offset,
            content_size_in_bytes=length,
        )
        delete_file.spec_id = table.spec().spec_id
        delete_files.append(delete_file)
    with table.transaction() as tx:
        _AddPositionDeletes(tx, table, delete_files, _DeletionVectorManifestWriter).commit()
    return path, places


def vectors_puffin(vectors: Mapping[str, Mapping[int, BitMap]]) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """A Puffin file of one ``deletion-vector-v1`` blob per data file of ``vectors``, in order; the file and each
    data file's blob (offset, length)."""
    out, metas, places = bytearray(b"PFA1"), [], {}
    for referenced, bitmaps in vectors.items():
        single, offset, length = deletion_vector_puffin(referenced, bitmaps)
        size = int.from_bytes(single[-12:-8], "little")
        [meta] = json.loads(single[-12 - size : -12])["blobs"]
        meta["offset"], places[referenced] = len(out), (len(out), length)
        out += single[offset : offset + length]
        metas.append(meta)
    footer = json.dumps({"blobs": metas}).encode()
    return bytes(out + b"PFA1" + footer + struct.pack("<I", len(footer)) + b"\0\0\0\0PFA1"), places


POSITION_DELETE_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": b"2147483546"}),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"2147483545"}),
    ]
)


class _DeleteManifestWriter(ManifestWriterV2):
    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class _DeletionVectorManifestWriter(_DeleteManifestWriter):
    """A v3 delete manifest: its entries keep ``content_offset`` and ``content_size_in_bytes`` (written from v3
    records: pyiceberg's writer writes v2 ones, dropping them)."""

    @property
    def version(self) -> Any:
        return 3

    def new_writer(self) -> AvroOutputFile[ManifestEntry]:
        schema = self._with_partition(3)
        return AvroOutputFile[ManifestEntry](
            output_file=self._output_file,
            file_schema=schema,
            record_schema=schema,
            schema_name="manifest_entry",
            metadata=self._meta,
        )


class _AddPositionDeletes(_FastAppendFiles):
    """pyiceberg writes no delete files itself; this adds a delete manifest to an otherwise empty append."""

    def __init__(
        self,
        tx: Transaction,
        table: Table,
        delete_files: list[DataFile],
        writer: type[_DeleteManifestWriter] = _DeleteManifestWriter,
    ) -> None:
        super().__init__(Operation.OVERWRITE, tx, table.io)
        self._delete_files, self._writer = delete_files, writer

    def _process_manifests(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        writer = self._writer(
            self._transaction.table_metadata.spec(),
            self.schema(),
            self.new_manifest_output(),
            self.snapshot_id,
            self._compression,
        )
        with writer:
            for delete_file in self._delete_files:
                writer.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED, snapshot_id=self.snapshot_id, data_file=delete_file
                    )
                )
        return [*manifests, writer.to_manifest_file()]
