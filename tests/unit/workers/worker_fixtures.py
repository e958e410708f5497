"""Helpers for the worker unit tests: real local Iceberg tables (SQLite catalog, file:// Parquet), tickets."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.table import Table

from sqe.credentials import CredentialSet
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.ipc import BatchFrame, serialize_execute_response
from sqe.distributed.protocol.ticket import WireTableId, build_ticket
from sqe.restrictions import EMPTY_PLAN, RestrictionPlan, parse_restrictions
from tests.unit.sqe.iceberg_local import add_positional_deletes, build_events, build_numbers, local_catalog


@dataclass(frozen=True)
class LocalTables:
    events: Table  # identity-partitioned by grp, 5 files
    numbers: Table  # 4 files, unpartitioned
    deleted: Table  # like numbers, with positional deletes on its first file


def build_local_tables(root: Path) -> LocalTables:
    catalog = local_catalog(root, "wh")
    events, numbers = build_events(catalog), build_numbers(catalog)
    deleted = build_numbers(catalog, "ns.deleted")
    add_positional_deletes(deleted)
    return LocalTables(events, numbers, catalog.load_table("ns.deleted"))


def restriction_plan(table: Table, raw: dict[str, Any] | None) -> RestrictionPlan:
    if raw is None:
        return EMPTY_PLAN
    return parse_restrictions(raw, table.schema(), all_schemas=table.metadata.schemas)


def ticket_for(
    table: Table,
    *,
    plan: RestrictionPlan = EMPTY_PLAN,
    credentials: list[CredentialSet] | None = None,
    output: list[str] | None = None,
    fragment_id: str = "f-1",
    salt: bytes = b"s" * 16,
    pace_ms: int = 0,
) -> pb.ScanTicket:
    """A ticket over every file of ``table``, reading the output columns plus the restriction filter's."""
    schema = table.schema()
    output_ids = {schema.find_field(name).field_id for name in output} if output else set(schema.field_ids)
    output_ids &= {f.field_id for f in schema.columns}
    read_ids = output_ids | plan.filter_field_ids
    read_schema = schema.select(*[f.name for f in schema.columns if f.field_id in read_ids])
    return build_ticket(
        query_id="q-1",
        fragment_id=fragment_id,
        table=WireTableId("wh", ("ns",), table.name()[-1]),
        metadata=table.metadata,
        read_schema=read_schema,
        output_field_ids=output_ids,
        tasks=list(table.scan().plan_files()),
        credentials=credentials or [],
        restrictions=plan,
        salt=salt,
        pace_ms_per_file=pace_ms,
    )


def sorted_rows(table: pa.Table, key: str = "id") -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda row: row[key])


def wire(stream: Iterable[pb.ExecuteResponse | BatchFrame]) -> list[pb.ExecuteResponse]:
    """A fragment's stream as the coordinator receives it: through the worker's serializer, parsed by protobuf."""
    return [pb.ExecuteResponse.FromString(serialize_execute_response(m)) for m in stream]
