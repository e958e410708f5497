"""Concurrent changes of a protected table's pin on a file:// warehouse and a local SQLite database.

The interleavings are made deterministic by running the second change from inside the first one's write of its
new metadata file (after it verified its base, before it swaps pointer and pin): that is where a concurrent
request lands in a real server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sqe_catalog.errors import CommitFailedError
from sqe_catalog.tables import WarehouseTables, parse_commit_body
from tests.unit.sqe_catalog.integrity.test_guard_cache import ENCRYPTED, NS, create, rewrite, warehouse_tables


def _on_first_write(tables: WarehouseTables, action: Any) -> None:
    """Run ``action`` once, when the catalog next creates a file in storage."""
    io = tables._catalog.io
    new_output = io.new_output
    done: list[bool] = []

    def hooked(location: str) -> Any:
        if not done:
            done.append(True)
            action()
        return new_output(location)

    io.new_output = hooked  # type: ignore[method-assign]


def test_a_commit_racing_a_readmission_of_the_same_location_does_not_undo_it(tmp_path: Path) -> None:
    # The re-admission keeps the pointer (the file there was repaired and re-admitted) but changes the digest.
    # A commit built on the displaced revision must lose its compare-and-swap, not silently replace the
    # re-admitted revision with one derived from the displaced one.
    tables: WarehouseTables = warehouse_tables(tmp_path)
    location = create(tables, ENCRYPTED)

    def readmit() -> None:
        rewrite(location, owner="repaired")
        tables.register_table(NS, "t", location, actor="admin", overwrite=True)

    readmitted: list[str | None] = []
    _on_first_write(tables, lambda: (readmit(), readmitted.append(tables.integrity.trusted(NS, "t").digest)))
    commit = parse_commit_body({"updates": [{"action": "set-properties", "updates": {"a": "b"}}]})
    with pytest.raises(CommitFailedError):
        tables.commit_table(NS, "t", commit)
    trusted = tables.integrity.trusted(NS, "t")
    assert trusted is not None and (trusted.metadata_location, trusted.digest) == (location, readmitted[0])
    assert tables.load_table(NS, "t").metadata.properties.get("owner") == "repaired"
