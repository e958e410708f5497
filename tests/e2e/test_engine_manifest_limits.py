"""The engine reads a table's manifest list and manifests no further than the catalog's planning does.

A writer of the table (anyone with its write credentials) decides what those files hold: one swapped for a file
past ``MAX_MANIFEST_BYTES`` or for a deflate bomb past ``MAX_MANIFEST_DECOMPRESSED_BYTES`` makes the engine's
planning fail with :class:`sqe.errors.ManifestLimitError` naming the file kind and the limit, with the manifest
cache on or off, every time; other tables read as before. Real moto S3 and sqe-catalog; the swap is a plain
S3 write.
"""

from __future__ import annotations

import json
import struct
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from pyroaring import BitMap

from sqe.errors import DataFileError, DeleteFileLimitError, ManifestLimitError, QueryError, SQEError
from sqe.execution.cache import clear_process_caches
from tests.conftest import pyiceberg_catalog
from tests.e2e.test_catalog_planning import swap_manifest
from tests.e2e.test_engine_range_cache import session_for
from tests.helpers.avro import avro_long

if TYPE_CHECKING:
    from pathlib import Path

    from pyiceberg.table import Table

    from tests.conftest import CatalogServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]

ROWS = 100  # per append; two appends, so two manifests


def _table(workdir: Path, server: CatalogServer) -> str:
    ns = f"mlim_{uuid.uuid4().hex[:6]}"
    pyiceberg_catalog(server, server.admin).create_namespace(ns)
    with session_for(workdir, server, server.admin) as session:
        session.sql(f"CREATE TABLE {ns}.events AS SELECT i AS id FROM range(0, {ROWS}) r(i)")
        session.sql(f"INSERT INTO {ns}.events SELECT i AS id FROM range({ROWS}, {2 * ROWS}) r(i)")
    return f"{ns}.events"


def test_a_normal_table_plans_and_reads_as_before(catalog_server: CatalogServer, tmp_path: Path) -> None:
    table = _table(tmp_path, catalog_server)
    clear_process_caches()
    with session_for(tmp_path, catalog_server, catalog_server.admin) as session:
        for _ in range(2):  # cold, then from the manifest cache
            assert session.sql(f"SELECT count(*), sum(id) FROM {table} WHERE id >= 0").fetchall() == [
                (2 * ROWS, sum(range(2 * ROWS)))
            ]
        assert session.sql(f"SELECT count(*) FROM {table}").fetchall() == [(2 * ROWS,)]


@pytest.mark.parametrize("cached", [True, False], ids=["manifest-cache", "no-manifest-cache"])
@pytest.mark.parametrize("case", ["stored", "inflated"])
@pytest.mark.parametrize("kind", ["manifest list", "manifest"])
def test_the_engine_refuses_manifests_past_the_limits(
    catalog_server: CatalogServer, tmp_path: Path, kind: str, case: str, cached: bool
) -> None:
    # Before: the engine read the file whole (any size) and pyiceberg inflated each block whole.
    table = _table(tmp_path, catalog_server)
    ns, name = table.split(".")
    limit = swap_manifest(catalog_server, catalog_server.admin, (ns, name), kind, case)
    clear_process_caches()
    cache = None if cached else {"manifest_bytes": 0}
    queries = [f"SELECT sum(id) FROM {table} WHERE id >= 0"]
    if kind == "manifest list":
        queries.append(f"SELECT count(*) FROM {table}")  # answered from the manifest list alone
    with session_for(tmp_path, catalog_server, catalog_server.admin, cache) as session:
        for sql in queries * 2:  # a refused file is never kept: the second read is refused again
            with pytest.raises(SQEError) as raised:
                session.sql(sql).fetchall()
            assert type(raised.value) is ManifestLimitError, raised.value
            where = f"{catalog_server.warehouse}.{table}"
            assert str(raised.value) == f"cannot plan a scan of {where}: a {kind} of the table {limit}"


# ---------------------------------------------------------------------------------------------------------
# Position delete files are read whole into memory: a small file of many rows is refused from its footer


def _understated(parquet: bytes, rows: int) -> bytes:
    """``parquet`` with its footer's file-level row count (the first num_rows field, before the row groups')
    rewritten to say 1, in as many bytes (a non-minimal varint): the row groups still hold ``rows``."""
    footer_start = len(parquet) - 8 - int.from_bytes(parquet[-8:-4], "little")
    stated = b"\x16" + avro_long(rows)  # field 3, i64, compact protocol: the same zigzag varint as Avro's long
    at = parquet.index(stated, footer_start)
    one = bytes([0x82, *[0x80] * (len(stated) - 3), 0x00])
    return parquet[: at + 1] + one + parquet[at + len(stated) :]


def _position_delete_bomb(
    workdir: Path,
    server: CatalogServer,
    rows: int,
    file_format: str = "parquet",
    understated: bool = False,
    long_paths: bool = False,
) -> str:
    """A table whose one data file has a position delete file of ``rows`` rows (all position 0: a few KiB
    stored, dictionary- and run-length encoded), written with the table's own credentials; Parquet, or ORC
    (the delete manifest entry then says ORC). ``long_paths``: each row names a path of 64 KiB (another file),
    written 1,024 rows at a time."""
    import pyarrow as pa
    import pyarrow.orc as orc
    import pyarrow.parquet as pq

    from tests.unit.sqe.iceberg_local import POSITION_DELETE_SCHEMA, add_positional_deletes

    table = _table(workdir, server)
    ns, name = table.split(".")
    loaded = pyiceberg_catalog(server, server.admin).load_table((ns, name))
    target = add_positional_deletes(loaded, (0,), file_format)  # a real delete file, then swapped for the bomb
    loaded = pyiceberg_catalog(server, server.admin).load_table((ns, name))
    [delete_path] = {d.file_path for task in loaded.scan().plan_files() for d in task.delete_files}
    schema = POSITION_DELETE_SCHEMA
    size, path = (1 << 10, "s3://b/" + "x" * (1 << 16)) if long_paths else (1 << 20, target)
    batch = pa.table({"file_path": [path] * size, "pos": pa.array([0] * size, pa.int64())}, schema=schema)
    sink = pa.BufferOutputStream()
    if file_format == "orc":
        orc_writer = orc.ORCWriter(sink, compression="zstd")
        for _ in range(rows // batch.num_rows + 1):
            orc_writer.write(batch)
        orc_writer.close()
    else:
        with pq.ParquetWriter(sink, schema, compression="zstd") as writer:
            for _ in range(rows // batch.num_rows + 1):
                writer.write_table(batch, row_group_size=batch.num_rows)
    bucket, _, key = delete_path.removeprefix("s3://").partition("/")
    body = sink.getvalue().to_pybytes()
    total = (rows // batch.num_rows + 1) * batch.num_rows
    server.moto.client("s3").put_object(Bucket=bucket, Key=key, Body=_understated(body, total) if understated else body)
    return table


@pytest.mark.parametrize("file_format", ["parquet", "orc"])
def test_the_engine_refuses_a_position_delete_file_past_the_row_limit(
    catalog_server: CatalogServer, tmp_path: Path, file_format: str
) -> None:
    # Before: pyiceberg read the delete file into one Arrow table, every row, whatever its footer said (ORC
    # files, 3.5 GB of repeated paths here, were not checked at all).
    from sqe.execution.delete_limits import MAX_POSITION_DELETE_ROWS

    table = _position_delete_bomb(tmp_path, catalog_server, MAX_POSITION_DELETE_ROWS + 1, file_format)
    clear_process_caches()
    with session_for(tmp_path, catalog_server, catalog_server.admin) as session, pytest.raises(SQEError) as raised:
        session.sql(f"SELECT sum(id) FROM {table}").fetchall()
    assert type(raised.value) is DeleteFileLimitError, raised.value
    assert str(raised.value).endswith(
        f"a position delete file of the table holds more than {MAX_POSITION_DELETE_ROWS} rows "
        "(MAX_POSITION_DELETE_ROWS)"
    )


def test_a_footer_understating_its_rows_is_refused_by_its_row_groups(
    catalog_server: CatalogServer, tmp_path: Path
) -> None:
    # Before: only the footer's file-level row count was checked; one rewritten to say 1 passed, and pyarrow
    # read every row of the row groups.
    from sqe.execution.delete_limits import MAX_POSITION_DELETE_ROWS

    table = _position_delete_bomb(tmp_path, catalog_server, MAX_POSITION_DELETE_ROWS + 1, understated=True)
    clear_process_caches()
    with session_for(tmp_path, catalog_server, catalog_server.admin) as session, pytest.raises(SQEError) as raised:
        session.sql(f"SELECT sum(id) FROM {table}").fetchall()
    assert type(raised.value) is DeleteFileLimitError, raised.value


def test_the_engine_refuses_an_orc_delete_file_decoding_past_the_byte_limit(
    catalog_server: CatalogServer, tmp_path: Path
) -> None:
    # Before: only the ORC file's rows were checked; 17,408 rows of 64 KiB paths (600 KB stored) passed, and
    # pyiceberg decoded their 1.1 GB of paths whole, one string a row.
    from sqe.execution.delete_limits import MAX_POSITION_DELETE_BYTES

    rows = MAX_POSITION_DELETE_BYTES // (1 << 16) + 1024
    table = _position_delete_bomb(tmp_path, catalog_server, rows, "orc", long_paths=True)
    clear_process_caches()
    with session_for(tmp_path, catalog_server, catalog_server.admin) as session, pytest.raises(SQEError) as raised:
        session.sql(f"SELECT sum(id) FROM {table}").fetchall()
    assert type(raised.value) is DeleteFileLimitError, raised.value
    assert str(raised.value).endswith(
        f"a position delete file of the table holds more than {MAX_POSITION_DELETE_BYTES} bytes decoded "
        "(MAX_POSITION_DELETE_BYTES)"
    )


@pytest.mark.parametrize("file_format", ["parquet", "orc"])
def test_a_position_delete_file_within_the_limit_still_deletes(
    catalog_server: CatalogServer, tmp_path: Path, file_format: str
) -> None:
    table = _position_delete_bomb(tmp_path, catalog_server, 3 << 20, file_format)  # every row deletes position 0 only
    clear_process_caches()
    with session_for(tmp_path, catalog_server, catalog_server.admin) as session:
        assert session.sql(f"SELECT count(*) FROM {table} WHERE id >= 0").fetchall() == [(2 * ROWS - 1,)]


@pytest.mark.parametrize("which", ["files", "manifests"])
def test_metadata_tables_read_manifests_within_the_limits(
    catalog_server: CatalogServer, tmp_path: Path, which: str
) -> None:
    # Before: t$files and t$manifests read the manifest list and manifests through pyiceberg, unbounded.
    table = _table(tmp_path, catalog_server)
    ns, name = table.split(".")
    kind = "manifest list" if which == "manifests" else "manifest"
    limit = swap_manifest(catalog_server, catalog_server.admin, (ns, name), kind, "inflated")
    with session_for(tmp_path, catalog_server, catalog_server.admin) as session, pytest.raises(SQEError) as raised:
        session.sql(f'SELECT count(*) FROM {ns}."{name}${which}"').fetchall()
    assert type(raised.value) is ManifestLimitError, raised.value
    where = f"{catalog_server.warehouse}.{table}${which}"
    assert str(raised.value) == f"cannot read {where}: a {kind} of the table {limit}"


def test_optimize_refuses_a_position_delete_file_past_the_row_limit(
    catalog_server: CatalogServer, tmp_path: Path
) -> None:
    # Before: OPTIMIZE read the bin with pyiceberg's ArrowScan, which read every delete file whole.
    from sqe.execution.delete_limits import MAX_POSITION_DELETE_ROWS

    table = _position_delete_bomb(tmp_path, catalog_server, MAX_POSITION_DELETE_ROWS + 1)
    with session_for(tmp_path, catalog_server, catalog_server.admin) as session, pytest.raises(SQEError) as raised:
        session.sql(f"OPTIMIZE {table}").fetchall()
    assert type(raised.value) is DeleteFileLimitError, raised.value


# ---------------------------------------------------------------------------------------------------------
# Deletion vectors (format v3): pyiceberg reads the Puffin file whole and expands each bitmap into one position a
# row; a bitmap of a few KiB can name 2^32 positions. It may never name a row its data file does not hold.


def _deletion_vector_table(workdir: Path, server: CatalogServer, bitmaps: dict[int, BitMap]) -> str:
    """A format-version 3 table whose first data file (``ROWS`` rows) has the deletion vector ``bitmaps``
    (:func:`register_at_v3`)."""
    from tests.unit.sqe.iceberg_local import add_deletion_vector

    table = _table(workdir, server)
    ns, name = table.split(".")
    loaded = pyiceberg_catalog(server, server.admin).load_table((ns, name))
    add_deletion_vector(loaded, bitmaps)
    register_at_v3(server, loaded)
    return table


def register_at_v3(server: CatalogServer, loaded: Table) -> None:
    """Register the pyiceberg table ``loaded`` (its files, committed with its own credentials) again through the
    catalog as v3 metadata (the catalog upgrades no table to v3, and pyiceberg writes no v3 snapshot): dropped
    unpurged, then registered again at v3 metadata naming the same snapshots."""
    import requests

    ns, name = loaded.name()[-2:]
    catalog = pyiceberg_catalog(server, server.admin)
    loaded.refresh()
    metadata = json.loads(loaded.io.new_input(loaded.metadata_location).open().read())
    metadata["format-version"], next_row_id = 3, 0
    for snapshot in metadata["snapshots"]:
        added = int(snapshot["summary"].get("added-records", 0))
        snapshot["first-row-id"], snapshot["added-rows"], next_row_id = next_row_id, added, next_row_id + added
    metadata["next-row-id"] = next_row_id
    location = f"{loaded.location()}/metadata/{uuid.uuid4()}-v3.metadata.json"
    with loaded.io.new_output(location).create() as out:
        out.write(json.dumps(metadata).encode())
    catalog.drop_table((ns, name))  # its files stay
    url = f"{server.url}/v1/{server.warehouse}/namespaces/{ns}/register"
    headers = {"Authorization": f"Bearer {server.token(server.admin)}"}
    body = {"name": name, "metadata-location": location}
    registered = requests.post(url, json=body, headers=headers, timeout=60)
    assert registered.status_code == 200, registered.text
    assert registered.json()["metadata"]["format-version"] == 3


def _bitmap(start: int, stop: int) -> BitMap:
    bitmap = BitMap()
    bitmap.add_range(start, stop)
    bitmap.run_optimize()  # one run container per 65536 positions: 2^32 positions serialize to under 1 MiB
    return bitmap


def test_a_deletion_vector_within_its_data_file_still_deletes(catalog_server: CatalogServer, tmp_path: Path) -> None:
    table = _deletion_vector_table(tmp_path, catalog_server, {0: BitMap([0, 5, ROWS - 1])})
    clear_process_caches()
    with session_for(tmp_path, catalog_server, catalog_server.admin) as session:
        assert session.sql(f"SELECT count(*) FROM {table} WHERE id >= 0").fetchall() == [(2 * ROWS - 3,)]


DV_CASES = {
    "one-past-the-last-row": {0: _bitmap(0, ROWS + 1)},
    "2^32-positions": {0: _bitmap(0, 1 << 32)},
    "a-far-key": {(1 << 31) - 1: BitMap([0])},  # pyiceberg lists an empty bitmap for every key below it
    "an-empty-far-key": {0: BitMap([0]), (1 << 31) - 1: BitMap()},  # and for an empty one too
}


@pytest.mark.parametrize("case", list(DV_CASES))
def test_the_engine_refuses_a_deletion_vector_past_its_data_file(
    catalog_server: CatalogServer, tmp_path: Path, case: str
) -> None:
    # Before: pyiceberg expanded the bitmap whole (2^32 Python ints; 2^31 empty bitmaps for a far key), and
    # a vector naming rows past its data file's end was applied as if it were sound. (OPTIMIZE refuses a v3
    # table before it reads one; it checks its bins' delete files with the same function.)
    table = _deletion_vector_table(tmp_path, catalog_server, DV_CASES[case])
    clear_process_caches()
    with session_for(tmp_path, catalog_server, catalog_server.admin) as session:
        for sql in (f"SELECT sum(id) FROM {table}", f"SELECT count(*) FROM {table} WHERE id >= 0"):
            with pytest.raises(SQEError) as raised:
                session.sql(sql).fetchall()
            assert type(raised.value) is DeleteFileLimitError, raised.value
            assert str(raised.value).endswith(
                f"a deletion vector of the table names a position past its data file's {ROWS} rows"
            ), raised.value


# ---------------------------------------------------------------------------------------------------------
# Writes: pyiceberg's commit reads the previous manifest list (and, overwriting, its manifests) through the
# table's own FileIO; that read is bounded as planning's is, and the refused write leaves no data file.


@pytest.mark.parametrize(
    ("statement", "kind"),
    [
        ("INSERT INTO {table} VALUES (1000)", "manifest list"),  # a fast append reads the manifest list only
        ("OPTIMIZE {table}", "manifest"),
    ],
    ids=["insert", "optimize"],
)
def test_a_write_refuses_a_manifest_past_the_limits(
    catalog_server: CatalogServer, tmp_path: Path, statement: str, kind: str
) -> None:
    # Before: the commit (and OPTIMIZE's planning) read it whole and inflated each block whole.
    from tests.helpers.orphans import data_objects

    table = _table(tmp_path, catalog_server)
    ns, name = table.split(".")
    loaded = pyiceberg_catalog(catalog_server, catalog_server.admin).load_table((ns, name))
    files, snapshot = data_objects(catalog_server, loaded), loaded.metadata.current_snapshot_id
    limit = swap_manifest(catalog_server, catalog_server.admin, (ns, name), kind, "inflated")
    clear_process_caches()
    with session_for(tmp_path, catalog_server, catalog_server.admin) as session, pytest.raises(SQEError) as raised:
        session.sql(statement.format(table=table)).fetchall()
    assert type(raised.value) is ManifestLimitError, raised.value
    assert str(raised.value).endswith(f"{catalog_server.warehouse}.{table}: a {kind} of the table {limit}")
    assert data_objects(catalog_server, loaded) == files  # the refused INSERT's data file is deleted
    assert loaded.refresh().metadata.current_snapshot_id == snapshot


def _swap_deletion_vector(server: CatalogServer, table: str, change: Callable[[bytes], bytes]) -> None:
    ns, name = table.split(".")
    loaded = pyiceberg_catalog(server, server.admin).load_table((ns, name))
    [path] = {d.file_path for task in loaded.scan().plan_files() for d in task.delete_files}
    bucket, _, key = path.removeprefix("s3://").partition("/")
    s3 = server.moto.client("s3")
    s3.put_object(Bucket=bucket, Key=key, Body=change(s3.get_object(Bucket=bucket, Key=key)["Body"].read()))


def _with_footer(change: Callable[[dict[str, Any]], None]) -> Callable[[bytes], bytes]:
    """A Puffin file's swap that rewrites its footer's JSON with ``change``."""

    def swap(puffin: bytes) -> bytes:
        size = struct.unpack("<I", puffin[-12:-8])[0]
        start = len(puffin) - 12 - size
        footer = json.loads(puffin[start:-12])
        change(footer)
        encoded = json.dumps(footer).encode()
        return puffin[:start] + encoded + struct.pack("<I", len(encoded)) + puffin[-8:]

    return swap


def _blob_twice(footer: dict[str, Any]) -> None:
    footer["blobs"] *= 2  # blobs may not overlap


def _blob_update(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda footer: footer["blobs"][0].update(fields)


MALFORMED_DVS: dict[str, Callable[[bytes], bytes]] = {
    "overlapping-blobs": _with_footer(_blob_twice),
    "truncated": lambda puffin: puffin[: len(puffin) // 2],
    "no-referenced-data-file": lambda puffin: puffin.replace(b'"referenced-data-file"', b'"referenced-data-fil_"'),
    "compressed-footer": lambda puffin: puffin[:-8] + b"\1" + puffin[-7:],
    # pyiceberg refuses each of these with its own error (a reserved flag as a compressed footer, the footer's
    # pydantic model, a codec named by the model's Python field name)
    "reserved-footer-flag": lambda puffin: puffin[:-8] + b"\2" + puffin[-7:],
    "no-snapshot-id": lambda puffin: puffin.replace(b'"snapshot-id"', b'"snapshot-i_"'),
    "a-numeric-property": _with_footer(lambda footer: footer["blobs"][0]["properties"].update(cardinality=1)),
    "a-fractional-offset": _with_footer(_blob_update(offset=4.5)),
    "a-codec-by-field-name": _with_footer(_blob_update(compression_codec="lz4")),
}


@pytest.mark.parametrize("case", list(MALFORMED_DVS))
def test_the_engine_refuses_a_malformed_deletion_vector_file(
    catalog_server: CatalogServer, tmp_path: Path, case: str
) -> None:
    # Before: pyiceberg's own error surfaced (a KeyError naming the property, a ValueError on the magic).
    table = _deletion_vector_table(tmp_path, catalog_server, {0: BitMap([0])})
    _swap_deletion_vector(catalog_server, table, MALFORMED_DVS[case])
    clear_process_caches()
    with session_for(tmp_path, catalog_server, catalog_server.admin) as session, pytest.raises(SQEError) as raised:
        session.sql(f"SELECT sum(id) FROM {table}").fetchall()
    assert type(raised.value) is DeleteFileLimitError, raised.value
    assert str(raised.value).endswith("a deletion vector file of the table is not a Puffin file of deletion vectors")


def _blob_moved(puffin: bytes) -> bytes:
    """The Puffin file with 8 bytes before its one blob, the footer's offset moved with it: a sound file, but its
    blob is no longer where the manifest's delete-file entry says (content_offset)."""
    size = struct.unpack("<I", puffin[-12:-8])[0]
    start = len(puffin) - 12 - size
    footer = json.loads(puffin[start:-12])
    footer["blobs"][0]["offset"] += 8
    encoded = json.dumps(footer).encode()
    return puffin[:4] + bytes(8) + puffin[4:start] + encoded + struct.pack("<I", len(encoded)) + puffin[-8:]


def test_the_engine_refuses_a_deletion_vector_not_where_its_manifest_entry_says(
    catalog_server: CatalogServer, tmp_path: Path
) -> None:
    # Before: planning read delete-file entries without their v3 fields, and the blob was read wherever the
    # Puffin footer put it, whatever the manifest stated.
    table = _deletion_vector_table(tmp_path, catalog_server, {0: BitMap([0, 5, ROWS - 1])})
    _swap_deletion_vector(catalog_server, table, _blob_moved)
    clear_process_caches()
    with session_for(tmp_path, catalog_server, catalog_server.admin) as session, pytest.raises(SQEError) as raised:
        session.sql(f"SELECT sum(id) FROM {table}").fetchall()
    assert type(raised.value) is DeleteFileLimitError, raised.value
    assert str(raised.value).endswith(
        "a deletion vector of the table is not the blob its delete-file entry states "
        "(content_offset, content_size_in_bytes)"
    )


def _recode_manifests(server: CatalogServer, table: str, codec: bytes) -> None:
    """The table's current manifest list and manifests, rewritten in ``codec`` (a plain S3 write)."""
    from tests.helpers.avro import recoded, snappy_block

    ns, name = table.split(".")
    loaded = pyiceberg_catalog(server, server.admin).load_table((ns, name))
    snapshot = loaded.current_snapshot()
    assert snapshot is not None
    s3 = server.moto.client("s3")
    for path in [snapshot.manifest_list, *(m.manifest_path for m in snapshot.manifests(loaded.io))]:
        bucket, _, key = path.removeprefix("s3://").partition("/")
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        s3.put_object(Bucket=bucket, Key=key, Body=recoded(body, codec, snappy_block))


def _null_codec_table(workdir: Path, server: CatalogServer) -> str:
    ns = f"mcod_{uuid.uuid4().hex[:6]}"
    catalog = pyiceberg_catalog(server, server.admin)
    catalog.create_namespace(ns)
    import pyarrow as pa

    created = catalog.create_table(
        (ns, "events"), schema=pa.schema([("id", pa.int64())]), properties={"write.avro.compression-codec": "null"}
    )
    created.append(pa.table({"id": pa.array(range(ROWS), pa.int64())}))
    return f"{ns}.events"


@pytest.mark.parametrize("codec", [b"snappy", b"brotli"])
def test_a_manifest_codec_this_install_cannot_read_is_a_typed_error(
    catalog_server: CatalogServer, tmp_path: Path, codec: bytes
) -> None:
    # Before: pyiceberg's ImportError (snappy without python-snappy) or ValueError (an unknown codec, on the
    # metadata tables) reached the caller untyped.
    import importlib.util

    table = _null_codec_table(tmp_path, catalog_server)
    _recode_manifests(catalog_server, table, codec)
    ns, name = table.split(".")
    queries = [f"SELECT sum(id) FROM {table}", f'SELECT count(*) FROM {ns}."{name}$files"']
    clear_process_caches()
    with session_for(tmp_path, catalog_server, catalog_server.admin) as session:
        if codec == b"snappy" and importlib.util.find_spec("snappy") is not None:
            assert session.sql(queries[0]).fetchall() == [(sum(range(ROWS)),)]  # readable here: read as usual
            return
        for sql in queries:
            with pytest.raises(SQEError) as raised:
                session.sql(sql).fetchall()
            assert type(raised.value) is ManifestLimitError, raised.value
            assert "is written with an Avro codec SQE cannot read (it reads null, deflate, bzip2, zstandard)" in str(
                raised.value
            )


def _swap_blocks(
    server: CatalogServer, table: str, kind: str, block: bytes | None, schema: Callable[[Any], None] | None = None
) -> None:
    """Every block of the table's manifest list, or of its first manifest, replaced by ``block`` (None: kept)
    and its header's schema changed by ``schema`` (a plain S3 write of a null-codec container, as its writer
    could); the process caches cleared."""
    from tests.helpers.avro import recoded

    ns, name = table.split(".")
    loaded = pyiceberg_catalog(server, server.admin).load_table((ns, name))
    snapshot = loaded.current_snapshot()
    assert snapshot is not None
    path = snapshot.manifest_list if kind == "manifest list" else snapshot.manifests(loaded.io)[0].manifest_path
    bucket, _, key = path.removeprefix("s3://").partition("/")
    s3 = server.moto.client("s3")
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    swapped = recoded(body, b"null", lambda kept: kept if block is None else block, schema)
    s3.put_object(Bucket=bucket, Key=key, Body=swapped)
    clear_process_caches()


@pytest.mark.parametrize("block", [b"\x00" * 3, b"\xff" * 50, b"\x02" * 50], ids=["eof", "negative-size", "enum"])
@pytest.mark.parametrize("kind", ["manifest list", "manifest"])
def test_a_manifest_that_does_not_decode_is_a_typed_error(
    catalog_server: CatalogServer, tmp_path: Path, kind: str, block: bytes
) -> None:
    # Before: a container within the limits whose records do not decode failed planning with pyiceberg's
    # EOFError or SystemError, and the metadata tables with its ValueError, untyped.
    table = _null_codec_table(tmp_path, catalog_server)
    ns, name = table.split(".")
    _swap_blocks(catalog_server, table, kind, block)
    queries = [f"SELECT sum(id) FROM {table}", f"SELECT count(*) FROM {table}"]
    queries += [f'SELECT count(*) FROM {ns}."{name}${which}"' for which in ("files", "partitions", "manifests")]
    with session_for(tmp_path, catalog_server, catalog_server.admin) as session:
        for sql in queries:
            try:
                session.sql(sql).fetchall()
            except SQEError as exc:
                assert isinstance(exc, QueryError) and str(exc).startswith("cannot "), (sql, exc)
            # (a manifest's records are not read by a count the manifest list answers, or by t$manifests)


def _retyped(name: str, avro_type: str) -> Callable[[Any], None]:
    """A header schema change: the top-level field ``name`` stated as ``avro_type``."""

    def change(schema: Any) -> None:
        next(field for field in schema["fields"] if field["name"] == name)["type"] = avro_type

    return change


@pytest.mark.parametrize(("kind", "field"), [("manifest list", "manifest_path"), ("manifest", "status")])
def test_a_manifest_whose_schema_does_not_resolve_is_a_typed_error(
    catalog_server: CatalogServer, tmp_path: Path, kind: str, field: str
) -> None:
    # Found by fuzzing: a header schema stating a field in a type pyiceberg cannot promote to the one it reads
    # (a manifest path as a boolean) failed planning and the metadata tables with its ResolveError, untyped.
    table = _null_codec_table(tmp_path, catalog_server)
    ns, name = table.split(".")
    _swap_blocks(catalog_server, table, kind, None, _retyped(field, "boolean"))
    queries = [f"SELECT sum(id) FROM {table}"]
    queries += [f'SELECT count(*) FROM {ns}."{name}${which}"' for which in ("files", "manifests")]
    with session_for(tmp_path, catalog_server, catalog_server.admin) as session:
        for sql in queries[: 2 if kind == "manifest" else 3]:  # t$manifests reads no manifest
            with pytest.raises(QueryError, match="does not decode: Cannot promote boolean to "):
                session.sql(sql).fetchall()


def test_a_repeated_metadata_table_reads_its_manifests_from_the_manifest_cache(
    catalog_server: CatalogServer, tmp_path: Path
) -> None:
    # Before: t$files read the manifest list and manifests from the store on every query, and each read was
    # inflated twice (sized, then decoded by pyiceberg); through the manifest cache a repeat reads (and sizes)
    # nothing, as planning's repeats do.
    from tests.e2e.test_engine_footer_cache import MotoLog
    from tests.e2e.test_engine_range_cache import file_requests

    table = _table(tmp_path, catalog_server)
    ns, name = table.split(".")
    clear_process_caches()
    log = MotoLog(catalog_server.moto.pid)
    with session_for(tmp_path, catalog_server, catalog_server.admin) as session:
        sql = f'SELECT count(*) FROM {ns}."{name}$files"'
        assert session.sql(sql).fetchall() == [(2,)]
        log.mark()
        assert session.sql(sql).fetchall() == [(2,)]
        assert file_requests(log)["manifest"] == 0
        assert session.sql(f"SELECT sum(id) FROM {table} WHERE id >= 0").fetchall() == [(sum(range(2 * ROWS)),)]
        assert file_requests(log)["manifest"] == 0  # planning finds them kept too


def test_a_manifest_cache_miss_inflates_each_block_once(
    catalog_server: CatalogServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: a miss inflated each deflate block twice, once to size it and once more by pyiceberg's codec.
    from tests.helpers.avro import Inflations

    table = _table(tmp_path, catalog_server)  # pyiceberg's default manifest codec: deflate
    clear_process_caches()
    with session_for(tmp_path, catalog_server, catalog_server.admin) as session:
        inflations = Inflations(monkeypatch)
        assert session.sql(f"SELECT sum(id) FROM {table} WHERE id >= 0").fetchall() == [(sum(range(2 * ROWS)),)]
        cold = inflations.calls
        assert cold.keys() == {"zlib.decompressobj"} and cold["zlib.decompressobj"] >= 3  # the list, 2 manifests
        inflations.calls = {}
        assert session.sql(f"SELECT count(*) FROM {table} WHERE id < 10").fetchall() == [(10,)]
        assert set(inflations.calls) <= {"zlib.decompress"}  # a hit is not checked again: pyiceberg inflates it


# A block whose first string (a manifest list's manifest path; a v2 manifest entry's data file path, after its
# status, three null snapshot fields and its content) states 4,000 bytes where 5 follow.
OVERRUNS = {
    "manifest list": avro_long(4000) + b"s3://",
    "manifest": avro_long(1) + b"\x00\x00\x00" + avro_long(0) + avro_long(4000) + b"s3://",
}


@pytest.mark.parametrize("kind", list(OVERRUNS))
def test_a_value_running_past_its_block_is_refused_never_read_from_memory(
    catalog_server: CatalogServer, tmp_path: Path, kind: str
) -> None:
    # Before: pyiceberg's compiled decoder copied the 4,000 bytes that lay past the block in memory into the path
    # (a UnicodeDecodeError here, or a path carrying the process's memory to the store); the catalog's planning
    # ended in a 500.
    import requests

    table = _null_codec_table(tmp_path, catalog_server)
    ns, name = table.split(".")
    _swap_blocks(catalog_server, table, kind, OVERRUNS[kind])
    undecoded = "a manifest list or manifest of the table does not decode: an Avro value runs past the end of its block"
    with session_for(tmp_path, catalog_server, catalog_server.admin) as session, pytest.raises(QueryError) as raised:
        session.sql(f"SELECT sum(id) FROM {table}").fetchall()
    assert str(raised.value) == f"cannot plan a scan of {catalog_server.warehouse}.{table}: {undecoded}"
    url = f"{catalog_server.url}/v1/{catalog_server.warehouse}/namespaces/{ns}/tables/{name}/plan"
    headers = {"Authorization": f"Bearer {catalog_server.token(catalog_server.admin)}"}
    planned = requests.post(url, json={}, headers=headers, timeout=120)
    assert planned.status_code == 422, planned.text[:500]
    assert planned.json()["error"]["message"] == f"cannot plan this scan: {undecoded}"


# Avro has no end marker: a manifest cut at a block boundary (its one entry's block dropped), or a manifest list
# whose one block states one of the two manifests it holds, decoded fewer records without error.
MISSTATED: dict[str, tuple[Callable[[list[tuple[int, bytes]]], list[tuple[int, bytes]]], str]] = {
    "manifest": (lambda blocks: blocks[:-1], "a manifest holds 0 ADDED entries, its manifest list states 1"),
    "manifest list": (
        lambda blocks: [(1, data) for _count, data in blocks],
        "an Avro block holds more bytes than its stated records take",
    ),
}


@pytest.mark.parametrize("kind", list(MISSTATED))
def test_a_manifest_missing_records_is_refused_not_planned_short(
    catalog_server: CatalogServer, tmp_path: Path, kind: str
) -> None:
    # Before: the engine's plan (and the catalog's) left out one append's data file, and sum(id) answered the
    # other append's rows only, without error.
    import requests

    from tests.helpers.avro import reblocked

    table = _table(tmp_path, catalog_server)  # two appends: two manifests of one entry each (deflate)
    ns, name = table.split(".")
    loaded = pyiceberg_catalog(catalog_server, catalog_server.admin).load_table((ns, name))
    snapshot = loaded.current_snapshot()
    assert snapshot is not None
    path = snapshot.manifest_list if kind == "manifest list" else snapshot.manifests(loaded.io)[0].manifest_path
    bucket, _, key = path.removeprefix("s3://").partition("/")
    s3 = catalog_server.moto.client("s3")
    change, why = MISSTATED[kind]
    s3.put_object(Bucket=bucket, Key=key, Body=reblocked(s3.get_object(Bucket=bucket, Key=key)["Body"].read(), change))
    clear_process_caches()
    undecoded = f"a manifest list or manifest of the table does not decode: {why}"
    with session_for(tmp_path, catalog_server, catalog_server.admin) as session, pytest.raises(QueryError) as raised:
        session.sql(f"SELECT sum(id) FROM {table}").fetchall()
    assert str(raised.value) == f"cannot plan a scan of {catalog_server.warehouse}.{table}: {undecoded}"
    url = f"{catalog_server.url}/v1/{catalog_server.warehouse}/namespaces/{ns}/tables/{name}/plan"
    headers = {"Authorization": f"Bearer {catalog_server.token(catalog_server.admin)}"}
    planned = requests.post(url, json={}, headers=headers, timeout=120)
    assert planned.status_code == 422, planned.text[:500]
    assert planned.json()["error"]["message"] == f"cannot plan this scan: {undecoded}"


# ---------------------------------------------------------------------------------------------------------
# A data file's row group is read as exactly the rows it states: pyarrow reads no more than a row group's
# num_rows, so one understating its pages' rows read short without error.


@pytest.mark.parametrize("decoded", [True, False], ids=["decoded-cache", "no-decoded-cache"])
def test_the_engine_refuses_a_row_group_understating_its_rows(
    catalog_server: CatalogServer, tmp_path: Path, decoded: bool
) -> None:
    # Before: the row group said 1 row where its pages held 100, and sum(id) summed the one row read.
    from tests.unit.sqe.execution.test_row_group_rows import restated

    table = _table(tmp_path, catalog_server)
    ns, name = table.split(".")
    loaded = pyiceberg_catalog(catalog_server, catalog_server.admin).load_table((ns, name))
    path = next(iter(loaded.scan().plan_files())).file.file_path
    bucket, _, key = path.removeprefix("s3://").partition("/")
    s3 = catalog_server.moto.client("s3")
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    s3.put_object(Bucket=bucket, Key=key, Body=restated(body, ROWS, "group", 1))
    clear_process_caches()
    cache = None if decoded else {"decoded_bytes": 0}
    with (
        session_for(tmp_path, catalog_server, catalog_server.admin, cache) as session,
        pytest.raises(QueryError) as raised,
    ):
        session.sql(f"SELECT sum(id) FROM {table}").fetchall()
    assert str(raised.value).endswith("its row group 0 states 1 rows, its column chunk 0 100 values"), raised.value


def test_the_engine_refuses_a_row_group_whose_pages_hold_fewer_rows_read_without_the_range_cache(
    catalog_server: CatalogServer, tmp_path: Path
) -> None:
    # Two row groups of 1,000 rows whose footer says 1,005 and 995 (every count agreeing with the manifest's 2,000).
    # Before: without the range cache the dataset scanner read the file from the store, 1,995 rows, without error.
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.unit.sqe.execution.test_row_group_rows import restated_counts

    ns = f"mlim_{uuid.uuid4().hex[:6]}"
    catalog = pyiceberg_catalog(catalog_server, catalog_server.admin)
    catalog.create_namespace(ns)
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    table = catalog.create_table(f"{ns}.events", schema)
    buffer = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": list(range(2000))}, schema=schema), buffer, row_group_size=1000)
    data = restated_counts(buffer.getvalue().to_pybytes(), 1000, {0: 1005, 1: 995})
    bucket, _, prefix = table.location().removeprefix("s3://").partition("/")
    catalog_server.moto.client("s3").put_object(Bucket=bucket, Key=f"{prefix}/data/short.parquet", Body=data)
    table.add_files([f"s3://{bucket}/{prefix}/data/short.parquet"])
    clear_process_caches()
    with (
        session_for(tmp_path, catalog_server, catalog_server.admin, {"data_bytes": 0}) as session,
        pytest.raises(DataFileError) as raised,
    ):
        session.sql(f"SELECT sum(id) FROM {ns}.events").fetchall()
    assert str(raised.value) == (
        "cannot read a data file of the table: its row group 0 states 1005 rows, its pages held 1000"
    )
