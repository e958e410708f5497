"""The verified-revision cache of ``IntegrityGuard`` on a file:// warehouse and a local SQLite database.

Only read routes (``reuse_verified``) use it; an entry exists only after a storage read passed the check and
answers only while pointer, pin and the stored file's fingerprint (``stat``) are unchanged, so a commit is seen at
once and a file rewritten on disk is refused by the very next load; a bound of 0 keeps nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.types import LongType, NestedField

from sqe_catalog.auth import create_engine_for
from sqe_catalog.config import WarehouseConfig
from sqe_catalog.errors import MetadataIntegrityError
from sqe_catalog.tables import TableCreate, WarehouseTables, parse_commit_body

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False))
ENCRYPTED = {"format-version": "3", "encryption.key-id": "K1"}
NS = ("db",)


def warehouse_tables(tmp_path: Path, **settings: Any) -> WarehouseTables:
    warehouse = WarehouseConfig(name="wh", location=f"file://{tmp_path}/wh", **settings)
    tables = WarehouseTables(warehouse, create_engine_for(f"sqlite:///{tmp_path}/catalog.db"))
    tables.create_namespace(NS, {})
    return tables


def create(tables: WarehouseTables, properties: dict[str, str]) -> str:
    spec = TableCreate("t", SCHEMA, None, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, properties, False)
    location = tables.create_table(NS, spec).metadata_location
    assert location is not None
    return location


def rewrite(location: str, **properties: str) -> None:
    """Change the metadata file on disk behind the catalog's back."""
    path = Path(location.removeprefix("file://"))
    document = json.loads(path.read_text())
    document["properties"].update(properties)
    path.write_text(json.dumps(document))


def test_read_routes_reuse_a_verified_revision_and_writes_never_fill_the_cache(tmp_path: Path) -> None:
    tables = warehouse_tables(tmp_path)
    create(tables, ENCRYPTED)
    cache = tables.integrity.verified
    assert len(cache) == 0, "the create's own load does not fill the cache"
    first = tables.load_table(NS, "t", reuse_verified=True)
    again = tables.load_table(NS, "t", reuse_verified=True)
    assert again.document is first.document and cache.stats.hits == 1 and len(cache) == 1
    tables.load_table(NS, "t")  # a load without reuse reads storage and adds nothing
    assert cache.stats.hits == 1 and len(cache) == 1


def test_a_file_rewritten_after_a_verified_load_is_refused_by_the_next_load(tmp_path: Path) -> None:
    tables = warehouse_tables(tmp_path)
    location = create(tables, ENCRYPTED)
    tables.load_table(NS, "t", reuse_verified=True)
    rewrite(location, owner="mallory")
    for _ in range(2):
        with pytest.raises(MetadataIntegrityError, match="trusted digest"):
            tables.load_table(NS, "t", reuse_verified=True)
    commit = parse_commit_body({"updates": [{"action": "set-properties", "updates": {"a": "b"}}]})
    with pytest.raises(MetadataIntegrityError, match="trusted digest"):
        tables.commit_table(NS, "t", commit)


def test_a_rewrite_that_keeps_the_document_is_verified_again_and_served(tmp_path: Path) -> None:
    tables = warehouse_tables(tmp_path)
    location = create(tables, ENCRYPTED)
    first = tables.load_table(NS, "t", reuse_verified=True)
    path = Path(location.removeprefix("file://"))
    path.write_text(json.dumps(json.loads(path.read_text()), indent=2))  # whitespace only: the same digest
    again = tables.load_table(NS, "t", reuse_verified=True)
    assert again.document == first.document and again.document is not first.document, "read and checked again"
    assert tables.load_table(NS, "t", reuse_verified=True).document is again.document


def test_a_commit_changes_the_key_and_its_revision_is_verified_before_it_is_cached(tmp_path: Path) -> None:
    tables = warehouse_tables(tmp_path)
    create(tables, ENCRYPTED)
    before = tables.load_table(NS, "t", reuse_verified=True)
    commit = parse_commit_body({"updates": [{"action": "set-properties", "updates": {"a": "b"}}]})
    committed = tables.commit_table(NS, "t", commit)
    assert committed.metadata_location != before.metadata_location
    assert committed.metadata_location is not None
    rewrite(committed.metadata_location, owner="mallory")
    for _ in range(2):  # a refused revision is not cached either
        with pytest.raises(MetadataIntegrityError, match="trusted digest"):
            tables.load_table(NS, "t", reuse_verified=True)
    assert len(tables.integrity.verified) == 1, "only the first, verified revision"


def test_a_zero_bound_keeps_nothing_and_refuses_a_rewrite_on_the_next_load(tmp_path: Path) -> None:
    tables = warehouse_tables(tmp_path, metadata_cache_entries=0)
    location = create(tables, ENCRYPTED)
    tables.load_table(NS, "t", reuse_verified=True)
    assert len(tables.integrity.verified) == 0
    rewrite(location, owner="mallory")
    with pytest.raises(MetadataIntegrityError, match="trusted digest"):
        tables.load_table(NS, "t", reuse_verified=True)


def test_pointer_and_pin_come_from_one_query(tmp_path: Path) -> None:
    tables = warehouse_tables(tmp_path)
    assert tables.integrity.current(NS, "missing") == (None, None)
    location = create(tables, ENCRYPTED)
    pointer, pin = tables.integrity.current(NS, "t")
    assert pointer == location and pin is not None
    assert (pin.metadata_location, pin.key_id, pin.digest_version) == (location, "K1", "sqe-canonical-json-sha256-v1")


def test_within_the_recheck_interval_the_verified_revision_is_served_never_the_rewrite(tmp_path: Path) -> None:
    tables = warehouse_tables(tmp_path, metadata_recheck_seconds=3600)
    location = create(tables, ENCRYPTED)
    verified = tables.load_table(NS, "t", reuse_verified=True)
    rewrite(location, owner="mallory")
    served = tables.load_table(NS, "t", reuse_verified=True)
    assert served.document is verified.document and "owner" not in served.metadata.properties
    with pytest.raises(MetadataIntegrityError, match="trusted digest"):
        tables.load_table(NS, "t")  # a read without reuse (writes, purges) goes to storage at once


def test_a_pending_load_answers_its_candidate_only_once_the_fingerprint_matched(tmp_path: Path) -> None:
    tables = warehouse_tables(tmp_path)
    create(tables, ENCRYPTED)
    verified = tables.load_table(NS, "t", reuse_verified=True)
    pending = tables.load_table_pending(NS, "t")
    assert pending.table.document is verified.document  # the verified revision, to prepare the answer from
    assert pending.confirmed() is pending.table  # the stored file is unchanged: answered as prepared


def test_a_pending_load_of_a_file_rewritten_meanwhile_is_refused_when_confirmed(tmp_path: Path) -> None:
    tables = warehouse_tables(tmp_path)
    location = create(tables, ENCRYPTED)
    tables.load_table(NS, "t", reuse_verified=True)
    rewrite(location, owner="mallory")
    pending = tables.load_table_pending(NS, "t")
    with pytest.raises(MetadataIntegrityError, match="trusted digest"):
        pending.confirmed()
    with pytest.raises(MetadataIntegrityError, match="trusted digest"):
        tables.load_table_pending(NS, "t").confirmed()


def test_a_pending_load_of_a_rewrite_that_keeps_the_document_answers_the_file_read_again(tmp_path: Path) -> None:
    tables = warehouse_tables(tmp_path)
    location = create(tables, ENCRYPTED)
    first = tables.load_table(NS, "t", reuse_verified=True)
    path = Path(location.removeprefix("file://"))
    path.write_text(json.dumps(json.loads(path.read_text()), indent=2))  # whitespace only: the same digest
    pending = tables.load_table_pending(NS, "t")
    answered = pending.confirmed()
    assert answered is not pending.table, "the candidate is not the revision answered: the caller redoes its work"
    assert answered.document == first.document and answered.document is not first.document


def test_a_pending_load_of_an_uncached_table_is_verified_before_it_returns(tmp_path: Path) -> None:
    tables = warehouse_tables(tmp_path)
    location = create(tables, ENCRYPTED)
    rewrite(location, owner="mallory")
    with pytest.raises(MetadataIntegrityError, match="trusted digest"):
        tables.load_table_pending(NS, "t")
