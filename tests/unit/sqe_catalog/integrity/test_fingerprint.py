"""Fingerprints of stored metadata files: local files by content, unknown schemes and missing files give None."""

from __future__ import annotations

from pathlib import Path

from sqe_catalog.config import WarehouseConfig
from sqe_catalog.integrity.fingerprint import storage_fingerprint


def test_a_local_file_is_fingerprinted_by_its_bytes(tmp_path: Path) -> None:
    fingerprint = storage_fingerprint(WarehouseConfig(name="w", location=f"file://{tmp_path}"))
    path = tmp_path / "v1.metadata.json"
    path.write_text('{"a": 1}')
    first = fingerprint(f"file://{path}")
    assert first is not None and fingerprint(f"file://{path}") == first
    path.write_text('{"a": 2}')  # same size, written at once
    assert fingerprint(f"file://{path}") not in (None, first)


def test_no_fingerprint_for_a_missing_file_or_another_scheme(tmp_path: Path) -> None:
    fingerprint = storage_fingerprint(WarehouseConfig(name="w", location=f"file://{tmp_path}"))
    assert fingerprint(f"file://{tmp_path}/missing.metadata.json") is None
    assert fingerprint("gs://bucket/t/v1.metadata.json") is None
