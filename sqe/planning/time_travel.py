"""Time travel and metadata tables: which snapshot a ``FOR VERSION / TIMESTAMP AS OF`` names, and ``t$snapshots``.

A version is a snapshot id, or the name of a branch or tag (quoted: ``FOR VERSION AS OF 'audit'``); a timestamp
names the latest snapshot committed at or before it (on the main branch's history). The read-restrictions that
apply are always the table's *current* ones, bound by field id (``plan_scan`` does that), so a column renamed
since the snapshot is masked all the same.

Metadata tables expose manifests, file paths and statistics, all computed over every row: they are served only
to a caller who reads the table without any restriction, and refused with a typed error otherwise.
"""

from __future__ import annotations

import copy
import datetime as dt
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa

from sqe._text import first_line
from sqe.duckdb_connection import fold_row
from sqe.errors import QueryError, RestrictedTableError

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyiceberg.io import FileIO
    from pyiceberg.table import Table

    from sqe.catalog.base import LoadedTable
    from sqe.planning.statements import TimeTravel
    from sqe.restrictions import RestrictionPlan

METADATA_TABLES = ("snapshots", "history", "files", "partitions", "refs", "manifests")


def split_metadata_name(name: str) -> tuple[str, str | None]:
    """``orders$snapshots`` -> (``orders``, ``snapshots``); a plain name -> (name, None)."""
    base, sep, suffix = name.rpartition("$")
    if not sep or not base:
        return name, None
    if suffix.lower() not in METADATA_TABLES:
        raise QueryError(f"unknown metadata table ${suffix}; SQE has {', '.join('$' + m for m in METADATA_TABLES)}")
    return base, suffix.lower()


def resolve_snapshot(loaded: LoadedTable, travel: TimeTravel, parser: duckdb.DuckDBPyConnection) -> int:
    """The snapshot id a time-travel clause names in this table (typed QueryError when there is none)."""
    value = _evaluate(parser, travel)
    metadata = loaded.table.metadata
    if travel.kind == "version":
        if isinstance(value, str):
            ref = metadata.refs.get(value)
            if ref is None:
                raise QueryError(f"{loaded.ident} has no branch or tag named {value!r}")
            return ref.snapshot_id
        if not isinstance(value, int) or isinstance(value, bool):
            raise QueryError("FOR VERSION AS OF takes a snapshot id or a quoted branch or tag name")
        if metadata.snapshot_by_id(value) is None:
            raise QueryError(f"{loaded.ident} has no snapshot {value}")
        return value
    millis = _epoch_millis(value)
    # The last entry of the log at or before it, as Iceberg's own lookup takes: two commits may share a
    # millisecond (the later one is the table as of then), and writers' clocks may step back a little.
    for entry in reversed(metadata.snapshot_log):
        if entry.timestamp_ms <= millis:
            return entry.snapshot_id
    raise QueryError(f"{loaded.ident} has no snapshot at or before {dt.datetime.fromtimestamp(millis / 1000, dt.UTC)}")


def metadata_table(
    loaded: LoadedTable,
    which: str,
    restrictions: RestrictionPlan,
    metadata_io: Callable[[FileIO], FileIO] | None = None,
) -> pa.Table:
    """``t$snapshots`` and friends, read through the table's own (SQE) FileIO, wrapped by ``metadata_io`` (the
    session's manifest cache, as its plans read them); refused on restricted tables."""
    if restrictions.is_restricted:
        raise RestrictedTableError(
            f"{loaded.ident}${which}: metadata tables are only available on tables you read without restrictions"
        )
    # Imported here: this module is on the start-up path of every statement, the bounded reader imports pyiceberg.
    from sqe.planning.avro_limits import UNDECODABLE, UNDECODED, bounded_table

    inspect = bounded_table(_read_through(loaded, metadata_io), f"cannot read {loaded.ident}${which}").inspect
    try:
        if which == "snapshots":
            return inspect.snapshots()
        if which == "history":
            return inspect.history()
        if which == "files":
            return inspect.files()
        if which == "partitions":
            return inspect.partitions()
        if which == "refs":
            return inspect.refs()
        return inspect.manifests()
    except OSError as exc:
        raise QueryError(f"cannot read the metadata of {loaded.ident}: {first_line(exc)}") from None
    except ValueError as exc:  # pyiceberg's, for records that do not decode (a value outside an enum, ...)
        raise QueryError(f"cannot read {loaded.ident}${which}: {first_line(exc)}") from None
    except UNDECODABLE as exc:
        raise QueryError(f"cannot read {loaded.ident}${which}: {UNDECODED}: {first_line(exc)}") from None


def _read_through(loaded: LoadedTable, metadata_io: Callable[[FileIO], FileIO] | None) -> Table:
    """The loaded table reading through ``metadata_io`` (a shallow copy: the same metadata, another FileIO); a
    cache keeps only checked files, as the bounded IO on top of it checks them once."""
    if metadata_io is None:
        return loaded.table
    table = copy.copy(loaded.table)
    table.io = metadata_io(loaded.io)
    return table


def _evaluate(parser: duckdb.DuckDBPyConnection, travel: TimeTravel) -> object:
    """The clause's value, folded on the table-less parser connection."""
    try:
        row = fold_row(parser, travel.value, "time travel")
    except duckdb.Error as exc:
        raise QueryError(f"bad time-travel value {travel.value!r}: {first_line(exc)}") from None
    if row is None or row[0] is None:
        raise QueryError(f"time-travel value {travel.value!r} is NULL")
    return row[0]


def _epoch_millis(value: object) -> int:
    if isinstance(value, dt.datetime):
        stamp = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
        return int(stamp.timestamp() * 1000)
    if isinstance(value, dt.date):
        return int(dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC).timestamp() * 1000)
    if isinstance(value, str):
        try:
            return _epoch_millis(dt.datetime.fromisoformat(value))
        except ValueError:
            raise QueryError(f"FOR TIMESTAMP AS OF: {value!r} is not a timestamp") from None
    raise QueryError("FOR TIMESTAMP AS OF takes a timestamp")
