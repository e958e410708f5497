"""The CLI's renderings of a result show values as SQL shows them."""

from __future__ import annotations

import io
import json
from collections.abc import Callable

from sqe.formatting import render_table, write_table
from sqe.session import Session
from tests.unit.sqe.iceberg_local import LocalProvider

BIG = 10**50 - 1  # beyond HUGEINT: DuckDB types the literal BIGNUM, exported as an opaque Arrow blob


def test_a_bignum_shows_as_its_number_not_its_storage_bytes(
    provider: LocalProvider, session_factory: Callable[..., Session]
) -> None:
    session = session_factory(provider)
    table = session.sql(f"SELECT {BIG} AS big, -5::BIGNUM AS neg, 0::BIGNUM AS zero, NULL::BIGNUM AS nothing").arrow()
    assert str(BIG) in render_table(table) and "| -5 " in render_table(table)
    out = io.StringIO()
    write_table(table, "json", out)
    assert json.loads(out.getvalue()) == {"big": str(BIG), "neg": "-5", "zero": "0", "nothing": None}
    out = io.StringIO()
    write_table(table, "csv", out)
    assert out.getvalue().splitlines()[1] == f"{BIG},-5,0,"
