"""Concurrent changes of a protected table's pin on a file:// warehouse and a local SQLite database.

The interleavings are made deterministic by running the second change from inside the first one's write of its
new metadata file (after it verified its base, before it swaps pointer and pin): that is where a concurrent
request lands in a real server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sqe_catalog.errors import AlreadyExistsError, CommitFailedError, MetadataIntegrityError, NoSuchTableError
from sqe_catalog.integrity.notifications import Notification
from sqe_catalog.integrity.state import list_events
from sqe_catalog.tables import WarehouseTables, parse_commit_body
from tests.unit.sqe_catalog.integrity.test_guard_cache import ENCRYPTED, NS, create, rewrite, warehouse_tables

PLAINTEXT = {"format-version": "3"}


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


def _on_first_read(tables: WarehouseTables, action: Any) -> None:
    """Run ``action`` once, right after the catalog next opened a file in storage for reading."""
    io = tables._catalog.io
    new_input = io.new_input
    done: list[bool] = []

    def hooked(location: str) -> Any:
        opened = new_input(location)
        if not done:
            done.append(True)
            action()
        return opened

    io.new_input = hooked  # type: ignore[method-assign]


@pytest.mark.parametrize("properties", [PLAINTEXT, ENCRYPTED], ids=["plaintext", "encrypted"])
def test_a_purge_drop_racing_a_commit_is_refused(tmp_path: Path, properties: dict[str, str]) -> None:
    # The purge verified one revision; a commit then moved the table on. A drop that went ahead would persist a
    # task for the verified revision only: an encrypted table's task pairs it with the new digest and fails as
    # if storage had been tampered with, a plaintext one leaves the new revision's files behind and, once done,
    # frees the location with them still there.
    tables: WarehouseTables = warehouse_tables(tmp_path)
    location = create(tables, properties)
    commit = parse_commit_body({"updates": [{"action": "set-properties", "updates": {"a": "b"}}]})
    _on_first_read(tables, lambda: tables.commit_table(NS, "t", commit))
    with pytest.raises(CommitFailedError):
        tables.drop_table(NS, "t", purge=True)
    current = tables.load_table(NS, "t")
    assert current.metadata_location != location and current.metadata.properties["a"] == "b"


def test_a_notification_update_never_replaces_an_encrypted_tables_digest_even_racing_a_recreate(
    tmp_path: Path,
) -> None:
    # The notification was checked against a protected plaintext table; by the time it is carried out, the name
    # holds a new protected encrypted table. It must still not replace that table's trusted digest.
    tables: WarehouseTables = warehouse_tables(tmp_path)
    create(tables, PLAINTEXT)
    admitted = f"{tables.root}/db/incoming.metadata.json"
    Path(admitted.removeprefix("file://")).parent.mkdir(parents=True, exist_ok=True)
    Path(admitted.removeprefix("file://")).write_text("{}")

    def recreate_encrypted() -> None:
        tables.drop_table(NS, "t", purge=False)
        location = create(tables, ENCRYPTED)
        document = json.loads(Path(location.removeprefix("file://")).read_text())
        document["properties"]["owner"] = "notifier"
        Path(admitted.removeprefix("file://")).write_text(json.dumps(document))

    _on_first_read(tables, recreate_encrypted)
    with pytest.raises(MetadataIntegrityError, match="notification"):
        tables.notify(NS, "t", Notification("UPDATE", 1, admitted), actor="notifier")
    pinned = tables.integrity.trusted(NS, "t")
    assert pinned is not None and pinned.metadata_location != admitted


def test_a_notification_does_only_what_was_authorized_when_the_table_appears_or_goes(tmp_path: Path) -> None:
    # Found by review: the API authorized an UPDATE or DROP of a missing table with TABLE_CREATE only, and the
    # notification then decided again whether the table existed: one created in between was re-admitted or dropped
    # by a caller without TABLE_FULL_METADATA (and an UPDATE authorized for an existing table created a new one).
    tables: WarehouseTables = warehouse_tables(tmp_path)
    location = create(tables, PLAINTEXT)  # appeared after the caller was authorized for a missing table
    for kind in ("UPDATE", "DROP"):
        with pytest.raises(AlreadyExistsError):
            tables.notify(NS, "t", Notification(kind, 1, location), actor="creator", authorized_for=False)
    assert tables.integrity.current(NS, "t")[0] == location
    assert list_events(tables._catalog.engine) == []  # nothing re-admitted
    tables.drop_table(NS, "t", purge=False)  # went after the caller was authorized for an existing table
    with pytest.raises(NoSuchTableError):
        tables.notify(NS, "t", Notification("UPDATE", 2, location), actor="manager", authorized_for=True)
    assert not tables.table_exists(NS, "t")
