"""Scan tickets: pyiceberg file tasks, credential sets and table metadata <-> ``sqe.worker.v1`` messages.

The coordinator builds tickets with :func:`build_ticket`; the worker reads them with :func:`decode_ticket`, which
validates everything up front (fail closed) and raises :class:`~sqe.distributed.protocol.errors.InvalidTicketError`
naming the problem, never a value. Credential sets are :class:`sqe.credentials.CredentialSet` objects (parsed from
catalog responses in ``sqe.credentials`` only); this module just converts them to and from protobuf and has them
checked by :mod:`sqe.distributed.protocol.credential_sets` (as a credential push is). Objects holding credentials
hide them from ``repr`` and refuse to be pickled.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, ClassVar, NoReturn, TypedDict, cast

from pydantic import TypeAdapter
from pyiceberg.exceptions import ValidationError as IcebergValidationError
from pyiceberg.expressions import AlwaysTrue, BooleanExpression, SerializableBooleanExpression
from pyiceberg.manifest import DATA_FILE_TYPE, DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask
from pyiceberg.table.metadata import TableMetadata, TableMetadataUtil
from pyiceberg.typedef import Record

from sqe.credentials import CredentialSet, StorageSettings
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.credential_sets import credential_sets_problem
from sqe.distributed.protocol.errors import InvalidTicketError
from sqe.distributed.protocol.filters import filter_from_proto, filter_to_proto
from sqe.distributed.protocol.partial import PartialAggregate
from sqe.errors import RestrictionError
from sqe.planning.user_filter import UserFilter
from sqe.restrictions import EMPTY_PLAN, MIN_SALT_BYTES, RestrictionPlan, check_applicable

# Names and ids end up in log lines: keep them to a safe alphabet (no newlines, no control characters).
_ID_PATTERN = re.compile(r"[A-Za-z0-9._:@/-]{1,128}")
_KEPT_PROPERTIES = ("schema.name-mapping.default",)  # ArrowScan's name mapping; other properties stay home
_TRIMMED_FIELDS: dict[str, Any] = {
    "snapshots": [],
    "snapshot_log": [],
    "metadata_log": [],
    "refs": {},
    "current_snapshot_id": None,
    "statistics": [],
    "partition_statistics": [],
}
_READABLE_DATA_FORMATS = frozenset({FileFormat.PARQUET, FileFormat.ORC})
_READABLE_DELETE_FORMATS = frozenset({FileFormat.PARQUET, FileFormat.ORC, FileFormat.PUFFIN})
_V3_FIELDS = tuple(f.name for f in DATA_FILE_TYPE[3].fields)
_EXPRESSION: TypeAdapter[Any] = TypeAdapter(cast(Any, SerializableBooleanExpression))
_ALWAYS_TRUE: BooleanExpression = AlwaysTrue()


# ------------------------------------------------------------------------------- settings and credential sets


def settings_to_proto(settings: StorageSettings) -> pb.StorageSettings:
    """Endpoint, region and path style travel; timeouts are the reader's own."""
    message = pb.StorageSettings(endpoint=settings.endpoint or "", region=settings.region or "")
    if settings.path_style is not None:
        message.path_style = settings.path_style
    return message


def settings_from_proto(message: pb.StorageSettings) -> StorageSettings:
    path_style = message.path_style if message.HasField("path_style") else None
    return StorageSettings(message.endpoint or None, message.region or None, path_style)


def credentials_to_proto(credentials: CredentialSet) -> pb.CredentialSet:
    """A set with a prefix (a config-level set travels as the set for ``s3://``)."""
    source = pb.CREDENTIAL_SOURCE_STATIC if credentials.source == "static" else pb.CREDENTIAL_SOURCE_VENDED
    return pb.CredentialSet(
        prefix=credentials.prefix or "",
        access_key_id=credentials.access_key_id,
        secret_access_key=credentials.secret_access_key,
        session_token=credentials.session_token or "",
        expires_at_ms=credentials.expires_at_ms or 0,
        source=source,
        storage=settings_to_proto(credentials.settings),
    )


def credentials_from_proto(message: pb.CredentialSet) -> CredentialSet:
    """Unvalidated (the source is kept: a static set stays static); see :func:`check_complete`."""
    return CredentialSet(
        prefix=message.prefix,
        access_key_id=message.access_key_id,
        secret_access_key=message.secret_access_key,
        session_token=message.session_token or None,
        expires_at_ms=message.expires_at_ms if message.expires_at_ms > 0 else None,
        source="static" if message.source == pb.CREDENTIAL_SOURCE_STATIC else "vended",
        settings=settings_from_proto(message.storage),
    )


def check_complete(credentials: Sequence[CredentialSet], where: str) -> None:
    """Raises InvalidTicketError naming the first problem of a ticket's sets (the shared check)."""
    problem = credential_sets_problem(credentials)
    if problem:
        raise InvalidTicketError(f"{where}: {problem}")


# -------------------------------------------------------------------------------------------- partitions


def encode_partition(partition: Record) -> bytes:
    """Partition values as the tagged JSON list documented in worker.proto (exact round trip)."""
    return json.dumps([_encode_value(partition[i]) for i in range(len(partition))], separators=(",", ":")).encode()


def _encode_value(value: object) -> object:
    if value is None:
        return None
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, float):
        return {"float": value.hex()}
    if isinstance(value, str):
        return {"str": value}
    if isinstance(value, bytes | bytearray):
        return {"bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Decimal):
        return {"decimal": str(value)}
    if isinstance(value, uuid.UUID):
        return {"uuid": str(value)}
    raise InvalidTicketError(f"a partition value of type {type(value).__name__} cannot be sent to a worker")


def decode_partition(data: bytes, where: str) -> Record:
    try:
        items = json.loads(data or b"[]")
    except (ValueError, RecursionError):
        raise InvalidTicketError(f"{where}: partition values are not JSON") from None
    if not isinstance(items, list):
        raise InvalidTicketError(f"{where}: partition values must be a JSON list")
    return Record(*(_decode_value(item, where) for item in items))


def _decode_value(item: object, where: str) -> object:
    if item is None:
        return None
    if not isinstance(item, dict) or len(item) != 1:
        raise InvalidTicketError(f"{where}: a partition value must be null or an object with one key")
    ((kind, raw),) = item.items()
    try:
        return _decode_tagged(kind, raw)
    except (ValueError, TypeError, InvalidOperation, binascii.Error):
        raise InvalidTicketError(f"{where}: malformed partition value of kind {kind!r}") from None


def _decode_tagged(kind: str, raw: object) -> object:
    if kind == "bool" and isinstance(raw, bool):
        return raw
    if kind == "int" and isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, str):
        if kind == "float":
            return float.fromhex(raw)
        if kind == "str":
            return raw
        if kind == "bytes":
            return base64.b64decode(raw.encode("ascii"), validate=True)
        if kind == "decimal":
            return Decimal(raw)
        if kind == "uuid":
            return uuid.UUID(raw)
    raise ValueError(kind)


# ----------------------------------------------------------------------------------------- files and tasks


class _FileFields(TypedDict):
    """The fields ``DataFile`` and ``DeleteFile`` messages share."""

    file_path: str
    file_format: str
    file_size_in_bytes: int
    record_count: int
    spec_id: int
    partition_json: bytes


def _file_fields(data_file: DataFile) -> _FileFields:
    return _FileFields(
        file_path=data_file.file_path,
        file_format=_format_name(data_file.file_format),
        file_size_in_bytes=data_file.file_size_in_bytes,
        record_count=data_file.record_count,
        spec_id=data_file.spec_id,
        partition_json=encode_partition(data_file.partition),
    )


def encode_task(task: FileScanTask) -> pb.FileTask:
    data_file = pb.DataFile(**_file_fields(task.file))
    deletes = [_encode_delete(d) for d in sorted(task.delete_files, key=lambda d: d.file_path)]
    return pb.FileTask(data_file=data_file, delete_files=deletes)


def _encode_delete(delete: DataFile) -> pb.DeleteFile:
    if delete.content == DataFileContent.EQUALITY_DELETES:
        raise InvalidTicketError(f"equality delete files are not supported: {delete.file_path}")
    message = pb.DeleteFile(content=pb.DELETE_CONTENT_POSITION, **_file_fields(delete))
    referenced, offset, size = (_v3_value(delete, name) for name in _V3_DV_FIELDS)
    if isinstance(referenced, str):
        message.referenced_data_file = referenced
    if isinstance(offset, int):
        message.content_offset = offset
    if isinstance(size, int):
        message.content_size_in_bytes = size
    return message


_V3_DV_FIELDS = ("referenced_data_file", "content_offset", "content_size_in_bytes")


def _v3_value(data_file: DataFile, name: str) -> object:
    """A v3-only DataFile field (pyiceberg 0.12 has no accessor), or None for a v1/v2 record."""
    return data_file[_V3_FIELDS.index(name)] if len(data_file) == len(_V3_FIELDS) else None


def _format_name(file_format: FileFormat | str) -> str:
    return file_format.value if isinstance(file_format, FileFormat) else str(file_format).upper()


def decode_task(message: pb.FileTask, index: int = 0) -> FileScanTask:
    where = f"task {index}"
    if not message.HasField("data_file"):
        raise InvalidTicketError(f"{where}: no data file")
    data_file = _data_file(DataFileContent.DATA, message.data_file, _READABLE_DATA_FORMATS, {}, where)
    deletes = {_decode_delete(d, f"{where} delete file {i}") for i, d in enumerate(message.delete_files)}
    return FileScanTask(data_file, delete_files=deletes)


def _decode_delete(message: pb.DeleteFile, where: str) -> DataFile:
    if message.content == pb.DELETE_CONTENT_EQUALITY:
        raise InvalidTicketError(f"{where}: equality deletes are not supported")
    if message.content != pb.DELETE_CONTENT_POSITION:
        raise InvalidTicketError(f"{where}: unknown delete content")
    v3: dict[str, object] = {}
    if message.referenced_data_file:
        v3["referenced_data_file"] = message.referenced_data_file
    for name in ("content_offset", "content_size_in_bytes"):
        if message.HasField(name):
            if getattr(message, name) < 0:
                raise InvalidTicketError(f"{where}: negative deletion-vector {name}")
            v3[name] = getattr(message, name)
    return _data_file(DataFileContent.POSITION_DELETES, message, _READABLE_DELETE_FORMATS, v3, where)


def _data_file(
    content: DataFileContent,
    message: pb.DataFile | pb.DeleteFile,
    formats: frozenset[FileFormat],
    v3: Mapping[str, object],
    where: str,
) -> DataFile:
    """The fields data and delete files share on the wire, validated; ``v3``: the deletion-vector extras."""
    file_format = _file_format(message.file_format, formats, where)
    partition = decode_partition(message.partition_json, where)
    if not message.file_path:
        raise InvalidTicketError(f"{where}: no file path")
    if message.file_size_in_bytes < 0 or message.record_count < 0:
        raise InvalidTicketError(f"{where}: negative size or record count")
    data_file = DataFile.from_args(
        3 if v3 else 2,
        content=content,
        file_path=message.file_path,
        file_format=file_format,
        partition=partition,
        record_count=message.record_count,
        file_size_in_bytes=message.file_size_in_bytes,
        **v3,
    )
    data_file.spec_id = message.spec_id
    return data_file


def _file_format(name: str, allowed: frozenset[FileFormat], where: str) -> FileFormat:
    try:
        file_format = FileFormat(name.upper())
    except ValueError:
        file_format = None
    if file_format not in allowed:
        raise InvalidTicketError(f"{where}: unsupported file format {name[:20]!r}")
    return file_format


# ------------------------------------------------------------------------------- metadata and row filters


def trim_metadata(metadata: TableMetadata) -> bytes:
    """TableMetadata JSON without snapshots, logs, refs, statistics and unrelated properties.

    The reader needs only the schemas, partition specs, name mapping and format version.
    """
    fields = type(metadata).model_fields
    update = {name: value for name, value in _TRIMMED_FIELDS.items() if name in fields}
    update["properties"] = {k: v for k, v in metadata.properties.items() if k in _KEPT_PROPERTIES}
    # model_dump, not model_dump_json: pyiceberg 0.12's v3 model refuses model_dump_json (its v3 *writer* is
    # unfinished), but the JSON of a v3 model parses back exactly, and the worker only reads it.
    trimmed = metadata.model_copy(update=update).model_dump(mode="json")
    return json.dumps(trimmed, separators=(",", ":")).encode()


def encode_row_filter(expression: BooleanExpression) -> bytes:
    """pyiceberg expression JSON, or b"" when it is always true or would not survive the round trip.

    Dropping is safe: the pushed filter only prunes (the worker then uses the restriction plan's own pushdown
    filter, and the exact restriction filter always runs on every batch).
    """
    if expression == _ALWAYS_TRUE:
        return b""
    text = expression.model_dump_json().encode()
    try:
        same = _parse_expression(text) == expression
    except (ValueError, TypeError, RecursionError):
        same = False
    return text if same else b""


def decode_row_filter(data: bytes) -> BooleanExpression | None:
    if not data:
        return None
    try:
        return _parse_expression(data)
    except (ValueError, TypeError, RecursionError):
        raise InvalidTicketError("row_filter_json is not a pyiceberg expression") from None


def _parse_expression(data: bytes) -> BooleanExpression:
    parsed = _EXPRESSION.validate_json(data)
    if not isinstance(parsed, BooleanExpression):
        raise ValueError("not a boolean expression")
    return parsed


# ---------------------------------------------------------------------------------------- whole tickets


@dataclass(frozen=True)
class WireTableId:
    """A table as named on the wire (``TableIdentifier``)."""

    warehouse: str
    namespace: tuple[str, ...]
    name: str

    def to_proto(self) -> pb.TableIdentifier:
        return pb.TableIdentifier(warehouse=self.warehouse, namespace=list(self.namespace), name=self.name)

    @classmethod
    def from_proto(cls, message: pb.TableIdentifier) -> WireTableId:
        return cls(message.warehouse, tuple(message.namespace), message.name)

    def __str__(self) -> str:
        dotted = ".".join((*self.namespace, self.name))
        return f"{self.warehouse}:{dotted}" if self.warehouse else dotted


def build_ticket(
    *,
    query_id: str,
    fragment_id: str,
    table: WireTableId,
    metadata: TableMetadata,
    read_schema: Schema,
    output_field_ids: Iterable[int],
    tasks: Sequence[FileScanTask],
    credentials: Sequence[CredentialSet],
    restrictions: RestrictionPlan = EMPTY_PLAN,
    salt: bytes = b"",
    row_filter: BooleanExpression = _ALWAYS_TRUE,
    storage: StorageSettings | None = None,
    pace_ms_per_file: int = 0,
    metadata_json: bytes | None = None,
    partial: PartialAggregate | None = None,
    user_filter: UserFilter | None = None,
    plain_offsets: bool = False,
) -> pb.ScanTicket:
    """A ticket for one fragment. Pass ``metadata_json`` (from :func:`trim_metadata`) to trim once per table."""
    return pb.ScanTicket(
        query_id=query_id,
        fragment_id=fragment_id,
        table=table.to_proto(),
        table_metadata_json=metadata_json if metadata_json is not None else trim_metadata(metadata),
        read_schema_json=read_schema.model_dump_json().encode(),
        output_field_ids=sorted(output_field_ids),
        row_filter_json=encode_row_filter(row_filter),
        restriction_plan_json=json.dumps(restrictions.to_json()).encode() if restrictions.is_restricted else b"",
        salt=salt,
        tasks=[encode_task(task) for task in tasks],
        credentials=[credentials_to_proto(cred) for cred in credentials],
        storage=settings_to_proto(storage or StorageSettings()),
        pace_ms_per_file=pace_ms_per_file,
        partial_aggregate=partial.to_proto() if partial is not None else None,
        user_filter=filter_to_proto(user_filter) if user_filter is not None else None,
        plain_offsets=plain_offsets,
    )


@dataclass(frozen=True, kw_only=True)
class DecodedFragment:
    """What every validated ticket (scan or rewrite) carries. Holds secrets: hidden from repr, never pickled."""

    _KIND: ClassVar[str] = "ticket"  # names the ticket in the pickling refusal

    query_id: str
    fragment_id: str
    table: WireTableId
    metadata: TableMetadata = field(repr=False)
    tasks: tuple[FileScanTask, ...] = field(repr=False)
    credentials: tuple[CredentialSet, ...] = field(repr=False)
    storage: StorageSettings = field(repr=False)
    pace_seconds: float = 0.0

    @property
    def files_total(self) -> int:
        return len(self.tasks)

    def __reduce__(self) -> NoReturn:
        raise TypeError(f"a decoded {self._KIND} holds credentials and cannot be pickled")


@dataclass(frozen=True, kw_only=True)
class DecodedTicket(DecodedFragment):
    """A validated scan ticket, ready to run."""

    read_schema: Schema = field(repr=False)
    output_field_ids: frozenset[int] = field(repr=False)
    row_filter: BooleanExpression = field(repr=False)
    restrictions: RestrictionPlan = field(repr=False)
    salt: bytes = field(repr=False)
    partial: PartialAggregate | None = None  # aggregate the restricted rows on the worker (partial rows only)
    user_filter: UserFilter | None = field(default=None, repr=False)  # the user's WHERE, on the restricted rows
    plain_offsets: bool = False  # strings and binaries sent with 32-bit offsets (see protocol.ipc.plain_offsets)

    @property
    def bytes_total(self) -> int:
        return sum(task.file.file_size_in_bytes for task in self.tasks)


def decode_ticket(message: pb.ScanTicket) -> DecodedTicket:
    """Validate and rebuild a ticket; any problem raises InvalidTicketError (the fragment never starts)."""
    query_id = checked_id(message.query_id, "query_id")
    fragment_id = checked_id(message.fragment_id, "fragment_id")
    metadata = decode_metadata(message.table_metadata_json)
    read_schema = _schema(message.read_schema_json)
    output = _output_ids(message.output_field_ids, read_schema)
    restrictions = _restrictions(message.restriction_plan_json, read_schema, message.salt)
    credentials = tuple(credentials_from_proto(c) for c in message.credentials)
    check_complete(credentials, "ticket")
    row_filter = decode_row_filter(message.row_filter_json)
    if row_filter is None:
        row_filter = _restriction_pushdown(restrictions, metadata)
    return DecodedTicket(
        query_id=query_id,
        fragment_id=fragment_id,
        table=WireTableId.from_proto(message.table),
        metadata=metadata,
        read_schema=read_schema,
        output_field_ids=output,
        row_filter=row_filter,
        restrictions=restrictions,
        salt=bytes(message.salt),
        tasks=tuple(decode_task(task, i) for i, task in enumerate(message.tasks)),
        credentials=credentials,
        storage=settings_from_proto(message.storage),
        pace_seconds=message.pace_ms_per_file / 1000.0,
        partial=_partial(message),
        user_filter=filter_from_proto(message.user_filter) if message.HasField("user_filter") else None,
        plain_offsets=message.plain_offsets,
    )


def _partial(message: pb.ScanTicket) -> PartialAggregate | None:
    return PartialAggregate.from_proto(message.partial_aggregate) if message.HasField("partial_aggregate") else None


def checked_id(value: str, name: str) -> str:
    """``value`` if it is a safe id (it ends up in log lines), else InvalidTicketError naming the field ``name``."""
    if not _ID_PATTERN.fullmatch(value):
        raise InvalidTicketError(f"{name} must be 1-128 characters of letters, digits and ._:@/-")
    return value


def decode_metadata(data: bytes) -> TableMetadata:
    """The table metadata of a ticket (from :func:`trim_metadata`), or InvalidTicketError naming no value."""
    try:
        return TableMetadataUtil.parse_raw(data.decode("utf-8"))
    except (ValueError, TypeError, RecursionError, IcebergValidationError):
        raise InvalidTicketError("table_metadata_json is not valid Iceberg table metadata") from None


def _schema(data: bytes) -> Schema:
    try:
        return Schema.model_validate_json(data)
    except (ValueError, TypeError, RecursionError):
        raise InvalidTicketError("read_schema_json is not a valid Iceberg schema") from None


def _output_ids(ids: Iterable[int], read_schema: Schema) -> frozenset[int]:
    output = frozenset(ids)
    top_level = {f.field_id for f in read_schema.columns}
    if not output:
        raise InvalidTicketError("output_field_ids is empty")
    if not output <= top_level:
        raise InvalidTicketError(f"output field ids {sorted(output - top_level)} are not in the read schema")
    return output


def _restrictions(data: bytes, read_schema: Schema, salt: bytes) -> RestrictionPlan:
    if not data:
        return EMPTY_PLAN
    try:
        plan = RestrictionPlan.from_json(data)
    except RestrictionError as exc:
        raise InvalidTicketError(f"restriction_plan_json: {exc}") from None
    read_ids = {f.field_id for f in read_schema.columns}
    missing = plan.filter_field_ids - read_ids
    if missing:
        raise InvalidTicketError(f"the restriction row filter reads field ids {sorted(missing)} the ticket does not")
    if "sha-256-query-local" in plan.masks.values() and len(salt) < MIN_SALT_BYTES:
        raise InvalidTicketError(f"sha-256-query-local needs a salt of at least {MIN_SALT_BYTES} bytes")
    _check_masks(plan, read_schema)
    return plan


def _check_masks(plan: RestrictionPlan, read_schema: Schema) -> None:
    """Every mask must be one the worker applies: the worker masks top-level columns only, so a mask of a field
    nested inside a column read would be skipped and the column sent unmasked; refuse it (fail closed), and a
    mask whose action does not apply to its column's type, before any file is read. A mask of a column the ticket
    does not read has nothing to mask (the table's plan covers every column, a ticket reads a few)."""
    top_level = {f.field_id: f for f in read_schema.columns}
    for mask in plan.column_masks:
        column = top_level.get(mask.field_id)
        if column is None:
            if mask.field_id in read_schema.field_ids:
                raise InvalidTicketError(
                    f"restriction_plan_json masks field id {mask.field_id}, nested inside a column read: a worker "
                    "masks top-level columns only"
                )
            continue
        try:
            check_applicable(mask.action, column)
        except RestrictionError as exc:
            raise InvalidTicketError(f"restriction_plan_json: {exc}") from None


def _restriction_pushdown(restrictions: RestrictionPlan, metadata: TableMetadata) -> BooleanExpression:
    try:
        return restrictions.safe_pushdown_filter(metadata.schema())
    except RestrictionError as exc:
        raise InvalidTicketError(f"restriction plan does not fit the table schema: {exc}") from None
