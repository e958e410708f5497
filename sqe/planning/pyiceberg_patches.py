"""The changes SQE makes to pyiceberg's Avro reading, in one place, installed together by :func:`install`.

Every Avro file pyiceberg reads in SQE's processes (manifest lists and manifests, in the engine and in
``sqe-catalog``) was written by some table writer, so each read is checked; and pyiceberg 0.12 reads one Iceberg
logical type not at all. :func:`install` makes, for the whole process:

- ``pyiceberg.avro.file.new_decoder``: :func:`sqe.planning.avro_decoder.bounded_decoder`, whose every read
  stays inside its block;
- ``pyiceberg.avro.file.Block``: :class:`EndCheckedBlock`, which refuses a block whose stated record count leaves
  bytes of it unread (Avro has no end marker: a block stating fewer records than it holds read as fewer records);
- ``ManifestFile.fetch_manifest_entry``: the same entries, refused when they are not those the manifest-list
  entry counts (:func:`sqe.planning.manifests.check_entry_counts`): a manifest cut at a block boundary decoded
  fewer entries without error;
- ``AvroSchemaConversion._convert_logical_type``: pyiceberg's, knowing ``timestamp-nanos`` too.

It refuses to run (``ImportError``) when any of those pyiceberg internals is missing or changed shape: a
pyiceberg that moved them would otherwise read unchecked. It is idempotent: a second call changes nothing.
``sqe.planning.avro_limits`` calls it at import; every reader of a manifest imports that module.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Any, TypeVar

import pyiceberg.avro.file as avro_file
from pyiceberg.manifest import ManifestFile
from pyiceberg.types import IcebergType, TimestampNanoType, TimestamptzNanoType
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

from sqe.planning.avro_decoder import MisstatedAvroError, bounded_decoder, unread_bytes
from sqe.planning.manifests import counted_entries

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyiceberg.io import FileIO
    from pyiceberg.manifest import ManifestEntry
    from pyiceberg.typedef import StructProtocol

__all__ = ["EndCheckedBlock", "install", "installed"]

D = TypeVar("D", bound="StructProtocol")
F = TypeVar("F", bound="Callable[..., Any]")

# What install() replaces, and the shape it relies on (a change here means pyiceberg changed under SQE).
_BLOCK_FIELDS = frozenset({"reader", "block_records", "block_decoder", "position"})
_MARK = "__sqe_patched__"
_LOCK = threading.Lock()


class EndCheckedBlock(avro_file.Block[D]):
    """pyiceberg's block of records, refusing one whose records leave some of its bytes unread."""

    def __next__(self) -> D:
        if self.position >= self.block_records:
            raise StopIteration
        self.position += 1
        record: D = self.reader.read(self.block_decoder)
        if self.position == self.block_records and unread_bytes(self.block_decoder):
            raise MisstatedAvroError("an Avro block holds more bytes than its stated records take")
        return record


def _marked(function: F) -> F:
    setattr(function, _MARK, True)
    return function


def _logical_type_with_nanos(original: Callable[..., IcebergType]) -> Callable[..., IcebergType]:
    def logical_type(self: AvroSchemaConversion, avro_logical_type: dict[str, Any]) -> IcebergType:
        """pyiceberg's conversion of an Avro logical type, knowing ``timestamp-nanos`` too: Iceberg writes its
        timestamp_ns and timestamptz_ns so (format v3; pyiceberg too), and pyiceberg 0.12 reads neither back, so
        a manifest partitioned by one such column did not plan."""
        if avro_logical_type.get("logicalType") == "timestamp-nanos" and avro_logical_type.get("type") == "long":
            return TimestamptzNanoType() if avro_logical_type.get("adjust-to-utc") is True else TimestampNanoType()
        return original(self, avro_logical_type)

    return _marked(logical_type)


def _counted_fetch(original: Callable[..., list[ManifestEntry]]) -> Callable[..., list[ManifestEntry]]:
    def fetch_manifest_entry(self: ManifestFile, io: FileIO, discard_deleted: bool = True) -> list[ManifestEntry]:
        """pyiceberg's read of a manifest's entries (all of them, to count them), refused unless they are those
        its manifest-list entry counts."""
        return counted_entries(self, original(self, io, discard_deleted=False), discard_deleted)

    return _marked(fetch_manifest_entry)


def _check_internals() -> None:
    """Refuse (``ImportError``) a pyiceberg whose internals are not those :func:`install` replaces."""
    missing = []
    if not callable(getattr(avro_file, "new_decoder", None)):
        missing.append("pyiceberg.avro.file.new_decoder")
    block = getattr(avro_file, "Block", None)
    if not (dataclasses.is_dataclass(block) and {f.name for f in dataclasses.fields(block)} >= _BLOCK_FIELDS):
        missing.append("pyiceberg.avro.file.Block (a dataclass of reader, block_records, block_decoder, position)")
    if not callable(getattr(AvroSchemaConversion, "_convert_logical_type", None)):
        missing.append("AvroSchemaConversion._convert_logical_type")
    if not callable(getattr(ManifestFile, "fetch_manifest_entry", None)):
        missing.append("ManifestFile.fetch_manifest_entry")
    if missing:
        raise ImportError(f"pyiceberg no longer has {', '.join(missing)}: SQE cannot check its Avro reads")


def installed() -> bool:
    """Whether :func:`install` has run in this process (every patch in place)."""
    return bool(
        getattr(avro_file, "new_decoder", None) is bounded_decoder
        and getattr(avro_file, "Block", None) is EndCheckedBlock
        and getattr(getattr(AvroSchemaConversion, "_convert_logical_type", None), _MARK, False)
        and getattr(getattr(ManifestFile, "fetch_manifest_entry", None), _MARK, False)
    )


def install() -> None:
    """Put every patch of this module in place, for the whole process; idempotent. Checked first, all at once:
    a pyiceberg lacking any internal patched is refused before anything is changed."""
    with _LOCK:
        if installed():
            return
        _check_internals()
        avro_file.new_decoder = bounded_decoder  # type: ignore[attr-defined,assignment]  # pyiceberg's by its name
        avro_file.Block = EndCheckedBlock  # type: ignore[misc]  # AvroFile._read_block builds its blocks by this name
        convert = AvroSchemaConversion._convert_logical_type
        if not getattr(convert, _MARK, False):  # each wrapped once: never a wrapper of a wrapper
            AvroSchemaConversion._convert_logical_type = _logical_type_with_nanos(convert)  # type: ignore[method-assign]
        fetch = ManifestFile.fetch_manifest_entry
        if not getattr(fetch, _MARK, False):
            ManifestFile.fetch_manifest_entry = _counted_fetch(fetch)  # type: ignore[method-assign]
