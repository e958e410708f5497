"""Rendering Arrow results as an aligned text table, CSV or JSON lines."""

from __future__ import annotations

import csv
import json
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any, TextIO

import pyarrow as pa

MAX_CELL = 60


def write_table(table: pa.Table, fmt: str, out: TextIO) -> None:
    table = _readable(table)
    if fmt == "csv":
        _write_csv(table, out)
    elif fmt == "json":
        _write_json(table, out)
    else:
        out.write(render_table(table))


def render_table(table: pa.Table) -> str:
    table = _readable(table)
    names = list(table.column_names)
    rows = [[_cell(v) for v in row.values()] for row in table.to_pylist()]
    widths = [len(n) for n in names]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out = [line, _row(names, widths), line]
    out += [_row(r, widths) for r in rows]
    out.append(line)
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out) + "\n"


def _readable(table: pa.Table) -> pa.Table:
    """DuckDB exports a BIGNUM (an integer literal beyond HUGEINT, say) as an opaque blob of its storage bytes:
    shown as hex it would be a wrong number, so it becomes the number's decimal text."""
    for i, field in enumerate(table.schema):
        kind = field.type
        if isinstance(kind, pa.OpaqueType) and (kind.vendor_name, kind.type_name) == ("DuckDB", "bignum"):
            blobs = [blob for chunk in table.column(i).chunks for blob in chunk.storage.to_pylist()]
            values = [None if blob is None else str(_bignum(blob)) for blob in blobs]
            table = table.set_column(i, pa.field(field.name, pa.string()), pa.array(values, pa.string()))
    return table


def _bignum(blob: bytes) -> int:
    """DuckDB's BIGNUM layout: 3 header bytes (top bit set for >= 0), then the magnitude big-endian; every byte
    of a negative number is inverted."""
    negative = not blob[0] & 0x80
    magnitude = bytes(~b & 0xFF for b in blob[3:]) if negative else blob[3:]
    value = int.from_bytes(magnitude, "big")
    return -value if negative else value


def _row(cells: list[str], widths: list[int]) -> str:
    return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    text = value.hex() if isinstance(value, bytes) else str(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def _write_csv(table: pa.Table, out: TextIO) -> None:
    writer = csv.writer(out)
    writer.writerow(table.column_names)
    for row in table.to_pylist():
        writer.writerow(["" if v is None else _plain(v) for v in row.values()])


def _write_json(table: pa.Table, out: TextIO) -> None:
    for row in table.to_pylist():
        out.write(json.dumps({k: _jsonable(v) for k, v in row.items()}, ensure_ascii=False) + "\n")


def _plain(value: Any) -> Any:
    return value.hex() if isinstance(value, bytes) else value


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value
