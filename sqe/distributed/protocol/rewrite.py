"""Rewrite tickets (distributed compaction): a bin of file tasks, credential sets and the exact output paths.

The coordinator builds them with :func:`build_rewrite_ticket`; the worker validates them with
:func:`decode_rewrite_ticket` (fail closed, :class:`InvalidTicketError` naming the problem, never a value). The
files a worker wrote come back as ``WrittenFile`` messages whose column statistics travel as JSON
(:func:`encode_file_stats` / :func:`decode_file_stats`); the coordinator commits the statistics of each file's own
footer, and a report that differs from them fails the compaction.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pyiceberg.table import FileScanTask

from sqe.credentials import CredentialSet, StorageSettings, normalize_location
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.errors import InvalidTicketError
from sqe.distributed.protocol.ticket import (
    DecodedFragment,
    WireTableId,
    check_complete,
    checked_id,
    credentials_from_proto,
    credentials_to_proto,
    decode_metadata,
    decode_task,
    encode_task,
    settings_from_proto,
    settings_to_proto,
)

_COUNT_MAPS = ("column_sizes", "value_counts", "null_value_counts", "nan_value_counts")
_BOUND_MAPS = ("lower_bounds", "upper_bounds")
MAX_OUTPUT_PATHS = 64


def build_rewrite_ticket(
    *,
    query_id: str,
    fragment_id: str,
    table: WireTableId,
    metadata_json: bytes,
    tasks: Sequence[FileScanTask],
    credentials: Sequence[CredentialSet],
    output_paths: Sequence[str],
    target_file_size: int,
    storage: StorageSettings | None = None,
    pace_ms_per_file: int = 0,
) -> pb.RewriteTicket:
    return pb.RewriteTicket(
        query_id=query_id,
        fragment_id=fragment_id,
        table=table.to_proto(),
        table_metadata_json=metadata_json,
        tasks=[encode_task(task) for task in tasks],
        credentials=[credentials_to_proto(cred) for cred in credentials],
        storage=settings_to_proto(storage or StorageSettings()),
        output_paths=list(output_paths),
        target_file_size=target_file_size,
        pace_ms_per_file=pace_ms_per_file,
    )


@dataclass(frozen=True, kw_only=True)
class DecodedRewrite(DecodedFragment):
    """A validated rewrite ticket."""

    _KIND: ClassVar[str] = "rewrite ticket"

    output_paths: tuple[str, ...] = field(repr=False)
    target_file_size: int = 0


def decode_rewrite_ticket(message: pb.RewriteTicket) -> DecodedRewrite:
    """Validate and rebuild a rewrite ticket; any problem raises InvalidTicketError (nothing is read or written)."""
    credentials = tuple(credentials_from_proto(c) for c in message.credentials)
    check_complete(credentials, "rewrite ticket")
    tasks = tuple(decode_task(task, i) for i, task in enumerate(message.tasks))
    if not tasks:
        raise InvalidTicketError("rewrite ticket: no file tasks")
    return DecodedRewrite(
        query_id=checked_id(message.query_id, "query_id"),
        fragment_id=checked_id(message.fragment_id, "fragment_id"),
        table=WireTableId.from_proto(message.table),
        metadata=decode_metadata(message.table_metadata_json),
        tasks=tasks,
        credentials=credentials,
        storage=settings_from_proto(message.storage),
        output_paths=_output_paths(message.output_paths),
        target_file_size=_target(message.target_file_size),
        pace_seconds=message.pace_ms_per_file / 1000.0,
    )


def _output_paths(paths: Sequence[str]) -> tuple[str, ...]:
    if not paths:
        raise InvalidTicketError("rewrite ticket: no output paths")
    if len(paths) > MAX_OUTPUT_PATHS:
        raise InvalidTicketError(f"rewrite ticket: more than {MAX_OUTPUT_PATHS} output paths")
    normalized = [normalize_location(p) for p in paths]
    if len(set(normalized)) != len(normalized):
        raise InvalidTicketError("rewrite ticket: output paths are not distinct")
    for path in normalized:
        if "://" not in path or not path.endswith(".parquet") or "/../" in path or any(c in path for c in "*?[\n"):
            raise InvalidTicketError("rewrite ticket: an output path is not an absolute .parquet object path")
    return tuple(normalized)


def _target(size: int) -> int:
    if size <= 0:
        raise InvalidTicketError("rewrite ticket: target_file_size must be positive")
    return size


# ------------------------------------------------------------------------------------------- file stats


def encode_file_stats(stats: Mapping[str, Any]) -> bytes:
    """pyiceberg's serialized statistics dict (``DataFileStatistics.to_serialized_dict``) as JSON."""
    out: dict[str, Any] = {name: {str(k): int(v) for k, v in (stats.get(name) or {}).items()} for name in _COUNT_MAPS}
    for name in _BOUND_MAPS:
        out[name] = {str(k): base64.b64encode(v).decode("ascii") for k, v in (stats.get(name) or {}).items()}
    offsets = stats.get("split_offsets")
    out["split_offsets"] = [int(o) for o in offsets] if offsets else None
    return json.dumps(out, separators=(",", ":")).encode()


def decode_file_stats(data: bytes) -> dict[str, Any]:
    """The inverse of :func:`encode_file_stats`, as ``DataFile.from_args`` keyword arguments."""
    try:
        raw = json.loads(data or b"{}")
        stats: dict[str, Any] = {name: {int(k): int(v) for k, v in raw.get(name, {}).items()} for name in _COUNT_MAPS}
        for name in _BOUND_MAPS:
            stats[name] = {int(k): base64.b64decode(v, validate=True) for k, v in raw.get(name, {}).items()}
        offsets = raw.get("split_offsets")
        stats["split_offsets"] = [int(o) for o in offsets] if offsets else None
    except (ValueError, TypeError, AttributeError, binascii.Error, RecursionError):
        raise InvalidTicketError("a written file's stats_json is malformed") from None
    return stats
