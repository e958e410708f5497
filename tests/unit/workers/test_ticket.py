"""Ticket <-> pyiceberg task conversion: exact round trips, fail-closed validation, secrets kept out of reprs."""

from __future__ import annotations

import json
import math
import pickle
import uuid
from decimal import Decimal

import pytest
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.expressions.parser import parse
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask
from pyiceberg.table.metadata import TableMetadataUtil, new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, TimestampNanoType

from sqe.credentials import CredentialSet, StorageSettings, parse_catalog_credentials
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.errors import InvalidTicketError
from sqe.distributed.protocol.ticket import (
    check_complete,
    credentials_from_proto,
    credentials_to_proto,
    decode_partition,
    decode_task,
    decode_ticket,
    encode_partition,
    encode_row_filter,
    encode_task,
    trim_metadata,
)
from sqe.restrictions import RestrictionPlan
from tests.unit.workers.worker_fixtures import LocalTables, restriction_plan, ticket_for

SECRET = "wJalrXUtnFEMI-secret-value"
TOKEN = "FwoGZXIvYXdzE-session-token"


def vended(prefix: str = "s3://bucket/wh/ns/t", **changes: object) -> CredentialSet:
    values: dict[str, object] = {
        "prefix": prefix,
        "access_key_id": "ASIAEXAMPLEKEY",
        "secret_access_key": SECRET,
        "session_token": TOKEN,
        "expires_at_ms": 4_102_444_800_000,
        "settings": StorageSettings("http://127.0.0.1:9000", "eu-west-1", True),
    }
    values.update(changes)
    return CredentialSet(**values)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------- partitions


def test_partition_values_of_every_kind_round_trip_exactly() -> None:
    values = Record(
        None,
        True,
        -(2**62),
        0.1,
        math.inf,
        "naïve",
        b"\x00\xff",
        Decimal("12.30"),
        uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e"),
    )
    decoded = decode_partition(encode_partition(values), "t")
    assert decoded == values
    assert [type(decoded[i]) for i in range(len(decoded))] == [type(values[i]) for i in range(len(values))]
    assert str(decoded[7]) == "12.30"  # the decimal keeps its scale


def test_nan_partition_value_survives() -> None:
    decoded = decode_partition(encode_partition(Record(math.nan)), "t")
    assert math.isnan(decoded[0])


@pytest.mark.parametrize(
    "raw",
    [b"{}", b"[1]", b'[{"int": true}]', b'[{"int": 1, "str": "x"}]', b'[{"bytes": "!!"}]', b'[{"what": 1}]', b"["],
)
def test_malformed_partition_values_are_refused(raw: bytes) -> None:
    with pytest.raises(InvalidTicketError, match="partition value"):
        decode_partition(raw, "task 3")


def test_unknown_partition_value_types_are_not_encoded() -> None:
    with pytest.raises(InvalidTicketError, match="type object"):
        encode_partition(Record(object()))


# ------------------------------------------------------------------------------------------------ tasks


def assert_same_task(original: FileScanTask, decoded: FileScanTask) -> None:
    a, b = original.file, decoded.file
    assert (b.file_path, b.file_format, b.file_size_in_bytes, b.record_count, b.spec_id, b.content) == (
        a.file_path,
        a.file_format,
        a.file_size_in_bytes,
        a.record_count,
        a.spec_id,
        a.content,
    )
    assert b.partition == a.partition
    assert sorted(d.file_path for d in decoded.delete_files) == sorted(d.file_path for d in original.delete_files)
    for d in decoded.delete_files:
        match = next(o for o in original.delete_files if o.file_path == d.file_path)
        assert (d.content, d.file_format, d.record_count, d.file_size_in_bytes) == (
            match.content,
            match.file_format,
            match.record_count,
            match.file_size_in_bytes,
        )


def test_partitioned_tasks_round_trip(local_tables: LocalTables) -> None:
    tasks = list(local_tables.events.scan().plan_files())
    assert len(tasks) == 5 and all(len(t.file.partition) == 1 for t in tasks)
    for i, task in enumerate(tasks):
        wire = pb.FileTask.FromString(encode_task(task).SerializeToString())
        assert_same_task(task, decode_task(wire, i))


def test_tasks_with_positional_deletes_round_trip(local_tables: LocalTables) -> None:
    tasks = list(local_tables.deleted.scan().plan_files())
    with_deletes = [t for t in tasks if t.delete_files]
    assert with_deletes  # pyiceberg attaches an unpartitioned positional delete file to every data file
    for task in tasks:
        assert_same_task(task, decode_task(encode_task(task)))


def test_equality_deletes_and_unknown_formats_are_refused(local_tables: LocalTables) -> None:
    task = encode_task(next(iter(local_tables.deleted.scan().plan_files())))
    bad_format = pb.FileTask()
    bad_format.CopyFrom(task)
    bad_format.data_file.file_format = "AVRO"
    with pytest.raises(InvalidTicketError, match="unsupported file format"):
        decode_task(bad_format)
    equality = pb.FileTask()
    equality.CopyFrom(task)
    equality.delete_files.add(file_path="s3://b/eq.parquet", file_format="PARQUET", content=pb.DELETE_CONTENT_EQUALITY)
    with pytest.raises(InvalidTicketError, match="equality deletes"):
        decode_task(equality)
    with pytest.raises(InvalidTicketError, match="no data file"):
        decode_task(pb.FileTask())


@pytest.mark.parametrize("field", ["content_offset", "content_size_in_bytes"])
def test_a_negative_deletion_vector_range_is_an_invalid_ticket(local_tables: LocalTables, field: str) -> None:
    # Found by review: a negative offset reached the reader and failed as an internal error (a retry elsewhere).
    task = encode_task(next(iter(local_tables.deleted.scan().plan_files())))
    vector = task.delete_files.add(
        file_path="s3://b/dv.puffin", file_format="PUFFIN", content=pb.DELETE_CONTENT_POSITION
    )
    setattr(vector, field, -1)
    with pytest.raises(InvalidTicketError, match=f"negative deletion-vector {field}"):
        decode_task(task)


# ------------------------------------------------------------------------------- metadata, row filters


def test_trimmed_metadata_keeps_what_the_reader_needs(local_tables: LocalTables) -> None:
    metadata = local_tables.events.metadata
    trimmed_json = trim_metadata(metadata)
    trimmed = TableMetadataUtil.parse_raw(trimmed_json.decode())
    assert trimmed.snapshots == [] and trimmed.current_snapshot_id is None
    assert trimmed.schema() == metadata.schema()
    assert trimmed.specs() == metadata.specs()
    assert trimmed.format_version == metadata.format_version
    assert len(trimmed_json) < len(metadata.model_dump_json())


def test_trimmed_metadata_of_a_format_v3_table_round_trips() -> None:
    """pyiceberg 0.12's v3 model refuses model_dump_json; the trimmed form must still carry v3 and ns types."""
    schema = Schema(NestedField(1, "ts", TimestampNanoType(), required=False), NestedField(2, "id", LongType()))
    metadata = new_table_metadata(
        schema, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, "s3://b/t", {"format-version": "3"}
    )
    metadata = metadata.model_copy(update={"next_row_id": 2**62 + 1})  # 64-bit values stay exact
    assert metadata.format_version == 3
    trimmed = TableMetadataUtil.parse_raw(trim_metadata(metadata).decode())
    assert trimmed.format_version == 3
    assert trimmed.schema() == metadata.schema()
    assert trimmed.next_row_id == 2**62 + 1


def test_row_filters_round_trip_or_are_dropped() -> None:
    expression = parse("id >= 5 and (label = 'x' or day is null)")
    assert json.loads(encode_row_filter(expression)) == json.loads(expression.model_dump_json())
    assert encode_row_filter(AlwaysTrue()) == b""


# ------------------------------------------------------------------------------------------ credentials


def test_complete_sets_pass_and_incomplete_ones_name_what_is_missing() -> None:
    check_complete([vended(), vended("s3://bucket/other"), vended("s3://b", source="static", session_token=None)], "t")
    with pytest.raises(InvalidTicketError, match=r"missing session token, expiry"):
        check_complete([vended(session_token=None, expires_at_ms=None)], "ticket")
    with pytest.raises(InvalidTicketError, match="missing secret access key"):
        check_complete([vended("s3://b", source="static", secret_access_key="")], "ticket")
    with pytest.raises(InvalidTicketError, match="two credential sets"):
        check_complete([vended("s3://b/x"), vended("s3a://b/x/")], "ticket")
    with pytest.raises(InvalidTicketError, match="no prefix"):
        check_complete([vended("")], "ticket")


@pytest.mark.parametrize("prefix", ["file:///etc", "gs://bucket/t", "abfss://c@a/t", "/var/data", "bucket/t"])
def test_credential_sets_for_anything_but_s3_are_refused(prefix: str) -> None:
    # A worker must never be steered to local files or another store by a ticket's credential prefix.
    with pytest.raises(InvalidTicketError, match=r"not an s3:// location"):
        check_complete([vended(prefix)], "ticket")
    check_complete([vended("S3A://Bucket/t"), vended("s3n://other/t")], "ticket")


def test_credential_sets_hide_secrets_and_refuse_pickling() -> None:
    cred = vended()
    assert SECRET not in repr(cred) and TOKEN not in repr(cred) and "ASIAEXAMPLEKEY" not in repr(cred)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(cred)
    assert credentials_from_proto(pb.CredentialSet.FromString(credentials_to_proto(cred).SerializeToString())) == cred


def test_credential_sets_from_a_load_table_response() -> None:
    response = {
        "config": {"s3.endpoint": "http://store:9000", "s3.path-style-access": "true", "client.region": "r1"},
        "storage-credentials": [
            {
                "prefix": "s3://bucket/wh/ns/t",
                "config": {
                    "s3.access-key-id": "AK",
                    "s3.secret-access-key": SECRET,
                    "s3.session-token": TOKEN,
                    "s3.session-token-expires-at-ms": "1700000000000",
                },
            },
            {"prefix": "s3://bucket/keyless", "config": {"s3.endpoint": "http://elsewhere"}},
        ],
    }
    (cred,) = parse_catalog_credentials(response).for_location("s3://bucket/wh/ns/t")
    assert (cred.prefix, cred.access_key_id, cred.expires_at_ms) == ("s3://bucket/wh/ns/t", "AK", 1_700_000_000_000)
    assert cred.settings == StorageSettings("http://store:9000", "r1", True)
    assert cred.missing_parts() == []
    in_config = {"config": {"s3.access-key-id": "AK", "s3.secret-access-key": SECRET}}
    (config_set,) = parse_catalog_credentials(in_config).for_location("s3://bucket/wh/ns/t")
    assert config_set.prefix == "s3://bucket/wh/ns/t"
    assert config_set.missing_parts() == ["session token", "expiry"]


# ---------------------------------------------------------------------------------------- whole tickets


def test_ticket_round_trip(local_tables: LocalTables) -> None:
    table = local_tables.events
    plan = restriction_plan(
        table,
        {
            "required-row-filter": {"type": "lt", "left": {"type": "reference", "id": 1}, "right": 1500},
            "required-column-projections": [{"field-id": 4, "action": "sha-256-query-local"}],
        },
    )
    wire = ticket_for(table, plan=plan, credentials=[vended()], output=["id", "label"], pace_ms=250)
    ticket = decode_ticket(pb.ScanTicket.FromString(wire.SerializeToString()))
    assert (ticket.query_id, ticket.fragment_id, str(ticket.table)) == ("q-1", "f-1", "wh:ns.events")
    assert ticket.output_field_ids == {1, 4}
    assert ticket.read_schema.field_ids == {1, 4}
    assert ticket.restrictions == plan
    assert ticket.credentials == (vended(),)
    assert ticket.files_total == 5 and ticket.bytes_total == sum(t.file.file_size_in_bytes for t in ticket.tasks)
    assert ticket.pace_seconds == 0.25
    assert ticket.plain_offsets is False  # unset: the scan schema's offsets
    wire.plain_offsets = True
    assert decode_ticket(pb.ScanTicket.FromString(wire.SerializeToString())).plain_offsets is True
    assert ticket.row_filter != AlwaysTrue()  # the restriction's own pushdown filter
    assert SECRET not in repr(ticket) and TOKEN not in repr(ticket)
    with pytest.raises(TypeError):
        pickle.dumps(ticket)


def _broken(ticket: pb.ScanTicket, **changes: object) -> pb.ScanTicket:
    copy = pb.ScanTicket()
    copy.CopyFrom(ticket)
    for name, value in changes.items():
        if isinstance(value, list):
            del getattr(copy, name)[:]
            getattr(copy, name).extend(value)
        else:
            setattr(copy, name, value)
    return copy


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"query_id": ""}, "query_id must be"),
        ({"fragment_id": "f\nINJECTED"}, "fragment_id must be"),
        ({"table_metadata_json": b"{}"}, "not valid Iceberg table metadata"),
        ({"read_schema_json": b"[]"}, "not a valid Iceberg schema"),
        ({"output_field_ids": []}, "output_field_ids is empty"),
        ({"output_field_ids": [1, 99]}, r"output field ids \[99\] are not in the read schema"),
        ({"restriction_plan_json": b'{"format": "x"}'}, "restriction_plan_json"),
        ({"row_filter_json": b'{"type": "nope"}'}, "not a pyiceberg expression"),
    ],
)
def test_malformed_tickets_are_refused(local_tables: LocalTables, changes: dict[str, object], message: str) -> None:
    ticket = ticket_for(local_tables.events, credentials=[vended()])
    with pytest.raises(InvalidTicketError, match=message):
        decode_ticket(_broken(ticket, **changes))


def test_ticket_with_an_incomplete_credential_set_is_refused(local_tables: LocalTables) -> None:
    ticket = ticket_for(local_tables.events, credentials=[vended(session_token=None)])
    with pytest.raises(InvalidTicketError, match="incomplete"):
        decode_ticket(ticket)


def test_restriction_filter_columns_must_be_read(local_tables: LocalTables) -> None:
    table = local_tables.events
    plan = restriction_plan(
        table, {"required-row-filter": {"type": "lt", "left": {"type": "reference", "id": 2}, "right": 3}}
    )
    ticket = ticket_for(table, plan=plan, output=["id"])
    narrowed = _broken(ticket, read_schema_json=table.schema().select("id").model_dump_json().encode())
    with pytest.raises(InvalidTicketError, match=r"reads field ids \[2\]"):
        decode_ticket(narrowed)


def test_query_local_hash_needs_a_salt(local_tables: LocalTables) -> None:
    table = local_tables.events
    plan = restriction_plan(table, {"required-column-projections": [{"field-id": 4, "action": "sha-256-query-local"}]})
    with pytest.raises(InvalidTicketError, match="salt"):
        decode_ticket(ticket_for(table, plan=plan, salt=b"short"))
    assert isinstance(decode_ticket(ticket_for(table, plan=plan)).restrictions, RestrictionPlan)
