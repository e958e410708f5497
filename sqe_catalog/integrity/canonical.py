"""Reading, writing and digesting Iceberg table metadata documents, exactly.

pyiceberg 0.12 parses every format version but refuses to *write* format-version 3, and its models drop
``encryption-keys`` and a snapshot's ``key-id``. The catalog therefore keeps two views of one metadata file:

- the **model** (pyiceberg's ``TableMetadata``), used to validate and to apply commit updates;
- the **document**: the model's JSON form (by alias, ``None`` fields left out) completed with every top-level and
  every per-snapshot field of the raw file that the model did not emit (``encryption-keys``, ``key-id``, ...).

The document is what the catalog writes, returns to clients and digests. JSON is parsed by Python's ``json``
module, whose integers are exact at any size (a 64-bit snapshot id never passes through a float); a float or a
non-finite constant anywhere in a metadata file is refused, because no Iceberg metadata field is a float and a
float would make the canonical form depend on number formatting.

The canonical form, version ``sqe-canonical-json-sha256-v1``: the document serialized by ``json.dumps`` with keys
sorted at every level, separators ``,`` and ``:`` (no whitespace), non-ASCII characters emitted as themselves,
encoded as UTF-8. The digest is the standard Base64 of the SHA-256 of those bytes. It covers the complete
document: format version, table uuid, location, sequence numbers, row-lineage counters (``next-row-id``), every
schema, partition spec and sort order, properties, every snapshot (with summary, schema id, ``first-row-id``,
``added-rows``, ``key-id``), snapshot log, metadata log, refs with their retention settings, statistics and
partition-statistics files (with blob metadata) and ``encryption-keys``. It does not cover the file's bytes:
whitespace, key order and gzip compression do not change it. Fields *nested below* a snapshot or the top level
that pyiceberg's models ignore are not covered (pyiceberg drops them while parsing).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyiceberg.io import FileIO
from pyiceberg.table.metadata import TableMetadata, TableMetadataUtil

from sqe.vocabulary import ENCRYPTION_KEYS
from sqe_catalog.errors import BadRequestError, MetadataIntegrityError

__all__ = [
    "DIGEST_VERSION",
    "MAX_METADATA_FILE_BYTES",
    "ParsedMetadata",
    "canonical_bytes",
    "check_new_metadata_size",
    "digest_document",
    "document_for_write",
    "parse_metadata_bytes",
    "read_metadata_bytes",
    "read_metadata_file",
    "serialize_document",
    "write_metadata_file",
]

DIGEST_VERSION = "sqe-canonical-json-sha256-v1"
SUPPORTED_DIGEST_VERSIONS = frozenset({DIGEST_VERSION})
_GZIP_MAGIC = b"\x1f\x8b"
# The largest metadata file, as stored and once decompressed, that the catalog reads or writes. A file is parsed
# whole in memory (its JSON takes several times its size as Python objects), and a table's writer can point a
# register or a notification at any file under its location: a 1 MiB gzip of 1 GiB of blanks raised the
# catalog's memory by 2 GiB for one request. Past this the file is refused before it is decompressed or parsed.
MAX_METADATA_FILE_BYTES = 128 * 1024 * 1024
# Top-level fields pyiceberg's models drop that a commit must carry from the base revision to the next one.
CARRIED_TOP_LEVEL_FIELDS = (ENCRYPTION_KEYS,)


@dataclass(frozen=True)
class ParsedMetadata:
    """One metadata file: the validated pyiceberg model and the complete JSON document."""

    metadata: TableMetadata
    document: dict[str, Any]


# ----------------------------------------------------------------------------------------------------
# Parsing


# The messages quote nothing of the file: an admission reads a file the caller names with the catalog's key, and
# its error answer must not show what the file holds (a number, a byte) to a caller who could not read it.


def _refuse_float(_text: str) -> Any:
    raise ValueError("a floating-point number in table metadata")


def _refuse_constant(_text: str) -> Any:
    raise ValueError("a non-finite number in table metadata")


def _too_large(what: str) -> ValueError:
    return ValueError(f"the metadata file {what} more than {MAX_METADATA_FILE_BYTES} bytes (MAX_METADATA_FILE_BYTES)")


def _decompressed(data: bytes) -> bytes:
    """``data``, gunzipped when it is gzip, never more than ``MAX_METADATA_FILE_BYTES`` of it (ValueError)."""
    if len(data) > MAX_METADATA_FILE_BYTES:
        raise _too_large("holds")
    if data[:2] != _GZIP_MAGIC:
        return data
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as stream:
            plain = stream.read(MAX_METADATA_FILE_BYTES + 1)
    except (OSError, EOFError, zlib.error):  # a truncated or corrupt gzip stream is not metadata
        raise ValueError("the metadata file is not a valid gzip stream") from None
    if len(plain) > MAX_METADATA_FILE_BYTES:
        raise _too_large("decompresses to")
    return plain


def parse_metadata_bytes(data: bytes) -> ParsedMetadata:
    """Parse a (possibly gzip-compressed) metadata file; ValueError when it is not valid Iceberg metadata or is
    larger than ``MAX_METADATA_FILE_BYTES``."""
    data = _decompressed(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:  # its message names the byte
        raise ValueError("the metadata file is not UTF-8 text") from None
    raw = json.loads(text, parse_float=_refuse_float, parse_constant=_refuse_constant)  # errors: positions only
    if not isinstance(raw, dict):
        raise ValueError("table metadata must be a JSON object")
    try:
        model = TableMetadataUtil.parse_obj(_with_table_uuid(raw))
    except Exception as exc:  # pyiceberg raises its own ValidationError or pydantic's
        raise ValueError(f"invalid table metadata: {type(exc).__name__}") from None
    return ParsedMetadata(model, _complete(model_document(model), raw, top_level=None))


# A v1 file may name no table-uuid: the one it gets is derived from its location.
_V1_TABLE_UUIDS = uuid.UUID("5a1e0c7e-1d3b-4f6e-9c51-3b2a7d9e8f10")


def _with_table_uuid(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with a table-uuid: pyiceberg draws a random one for a (v1) file that names none, so every read
    of the file would name another table, and no commit could assert the one its gate saw."""
    location = raw.get("location")
    if "table-uuid" in raw or not isinstance(location, str):
        return raw
    return {**raw, "table-uuid": str(uuid.uuid5(_V1_TABLE_UUIDS, location))}


def read_metadata_bytes(file_io: FileIO, location: str) -> bytes:
    """A table's or a view's metadata file, gunzipped; FileNotFoundError when missing, ValueError when it holds
    or decompresses to more than ``MAX_METADATA_FILE_BYTES``."""
    with file_io.new_input(location).open() as stream:
        data = stream.read(MAX_METADATA_FILE_BYTES + 1)  # one byte past the limit tells a larger file
    return _decompressed(data)


def read_metadata_file(file_io: FileIO, location: str) -> ParsedMetadata:
    """Read and parse a metadata file; FileNotFoundError when missing, ValueError when not valid metadata."""
    return parse_metadata_bytes(read_metadata_bytes(file_io, location))


def model_document(model: TableMetadata) -> dict[str, Any]:
    """The model as a JSON-ready dict (pyiceberg's ``model_dump_json`` refuses v3; ``model_dump`` does not)."""
    dumped: dict[str, Any] = model.model_dump(mode="json")
    return dumped


def _complete(document: dict[str, Any], source: Mapping[str, Any], top_level: tuple[str, ...] | None) -> dict[str, Any]:
    """``document`` plus the fields of ``source`` it lacks: at the top level (all of them, or only ``top_level``)
    and in every snapshot present in both (matched by snapshot id)."""
    for key, value in source.items():
        if key not in document and value is not None and (top_level is None or key in top_level):
            document[key] = value
    source_snapshots = {s.get("snapshot-id"): s for s in source.get("snapshots") or [] if isinstance(s, dict)}
    for snapshot in document.get("snapshots") or []:
        for key, value in source_snapshots.get(snapshot.get("snapshot-id"), {}).items():
            if key not in snapshot and value is not None:
                snapshot[key] = value
    return document


def document_for_write(model: TableMetadata, base: Mapping[str, Any] | None) -> dict[str, Any]:
    """The document of a new revision: the model plus what it dropped from ``base`` (the revision it was built
    from): ``encryption-keys`` and the extra fields of snapshots that are still present."""
    document = model_document(model)
    return _complete(document, base, CARRIED_TOP_LEVEL_FIELDS) if base is not None else document


# ----------------------------------------------------------------------------------------------------
# Writing


def serialize_document(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


_TABLE_SIZE_ADVICE = "expire snapshots or remove unused schemas and specs first"


def check_new_metadata_size(size: int, advice: str = _TABLE_SIZE_ADVICE) -> None:
    """A new metadata file of ``size`` bytes (uncompressed) must stay loadable: 400 past the read limit."""
    if size > MAX_METADATA_FILE_BYTES:
        raise BadRequestError(
            f"the new metadata file would hold {size} bytes, more than {MAX_METADATA_FILE_BYTES} bytes "
            f"(MAX_METADATA_FILE_BYTES): {advice}"
        )


def write_metadata_file(file_io: FileIO, location: str, document: Mapping[str, Any]) -> ParsedMetadata:
    """Write a new metadata file (never overwriting one) and return it as a reader will parse it."""
    data = serialize_document(document)
    check_new_metadata_size(len(data))  # no reader would load it back
    parsed = parse_metadata_bytes(data)  # what we digest is what a later load will read back
    with file_io.new_output(location).create(overwrite=False) as stream:
        stream.write(data)
    return parsed


# ----------------------------------------------------------------------------------------------------
# Canonical form and digest


def _check_canonicalizable(value: Any, where: str = "metadata") -> None:
    if isinstance(value, float):
        raise MetadataIntegrityError(f"{where} holds a floating-point number; it has no canonical form")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise MetadataIntegrityError(f"{where} has a non-string key")
            _check_canonicalizable(item, where)
    elif isinstance(value, list):
        for item in value:
            _check_canonicalizable(item, where)


def canonical_bytes(document: Mapping[str, Any]) -> bytes:
    """The ``sqe-canonical-json-sha256-v1`` serialization of a metadata document."""
    _check_canonicalizable(document)
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8")


def digest_document(document: Mapping[str, Any], version: str = DIGEST_VERSION) -> str:
    """Base64 SHA-256 of the canonical form; an unknown digest version fails closed."""
    if version not in SUPPORTED_DIGEST_VERSIONS:
        raise MetadataIntegrityError(f"unsupported metadata digest version {version[:64]!r}")
    return base64.b64encode(hashlib.sha256(canonical_bytes(document)).digest()).decode("ascii")
