"""Writing rows as new data files and committing them in one snapshot (INSERT, CREATE TABLE AS, DML).

pyiceberg deletes the manifests of a commit that failed, never its data files. A commit the catalog refused (a
409, pyiceberg's validation after its own retries, a manifest past the limits) did not land, so the files written
for it are deleted here (Spark's abort does the same); after any other failure (a 5xx, a lost answer) the commit
may have landed and the files stay. ``WriteTable`` already turns a 409 that answers a resent, landed commit into
success. A failure before any commit request was sent (writing a file, building manifests) leaves nothing
referenced: its files go too.
"""

from __future__ import annotations

import logging
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import requests
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.io.pyarrow import _dataframe_to_data_files
from pyiceberg.table import TableProperties
from pyiceberg.utils.properties import property_as_bool

from sqe._text import first_line
from sqe.catalog.errors import PYICEBERG_CATALOG_ERRORS, commit_state_unknown, translate_error
from sqe.errors import CommitConflictError, CommitStateUnknownError, ManifestLimitError, QueryError, SQEError
from sqe.execution import nested_nulls  # noqa: F401  # pyiceberg's projection keeps NULL lists/maps of structs
from sqe.execution.write_target import WriteTable, writable_table

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    import pyarrow as pa
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Transaction

    from sqe.catalog.base import LoadedTable

__all__ = ["append_rows", "overwrite_files"]

log = logging.getLogger(__name__)

SNAPSHOT_OPERATION_PROPERTY = "sqe.operation"  # which SQL statement an overwrite snapshot comes from


def append_rows(loaded: LoadedTable, data: pa.Table) -> None:
    """``data`` (in the table's Arrow shape) appended in one snapshot, as pyiceberg's ``append`` would."""
    with _committing(loaded) as commit, commit.table.transaction() as transaction:
        update = transaction.update_snapshot()
        merge = property_as_bool(
            transaction.table_metadata.properties,
            TableProperties.MANIFEST_MERGE_ENABLED,
            TableProperties.MANIFEST_MERGE_ENABLED_DEFAULT,
        )
        with update.merge_append() if merge else update.fast_append() as append:
            for data_file in commit.write(transaction, data):
                append.append_data_file(data_file)


def overwrite_files(loaded: LoadedTable, replaced: Iterable[DataFile], data: pa.Table, operation: str) -> None:
    """One overwrite snapshot: ``replaced`` out, ``data`` written in; ``operation`` names it in the summary."""
    with _committing(loaded) as commit, commit.table.transaction() as transaction:
        update = transaction.update_snapshot(snapshot_properties={SNAPSHOT_OPERATION_PROPERTY: operation})
        with update.overwrite() as overwrite:
            for data_file in replaced:
                overwrite.delete_data_file(data_file)
            for data_file in commit.write(transaction, data):
                overwrite.append_data_file(data_file)


@dataclass
class _Commit:
    """The table a commit goes through and the data files written for it so far."""

    table: WriteTable
    written: list[DataFile] = field(default_factory=list)

    def write(self, transaction: Transaction, data: pa.Table) -> Iterator[DataFile]:
        """``data`` written through SQE's FileIO as data files, each remembered before it is committed."""
        if not data.num_rows:
            return
        metadata = transaction.table_metadata
        for data_file in _dataframe_to_data_files(metadata, data, self.table.files_io, write_uuid=uuid.uuid4()):
            self.written.append(data_file)
            yield data_file

    def delete_written(self) -> None:
        """The data files of a commit that did not land: referenced by nothing."""
        for data_file in self.written:
            try:
                self.table.files_io.delete(data_file.file_path)
            except Exception as exc:  # best effort: the file is referenced by nothing either way
                log.warning("could not delete unreferenced data file %s: %s", data_file.file_path, first_line(exc))


@contextmanager
def _committing(loaded: LoadedTable) -> Iterator[_Commit]:
    """A commit to ``loaded``: failures as SQE's typed errors, its files deleted when it cannot have landed."""
    commit = None
    try:
        commit = _Commit(writable_table(loaded))
        yield commit
    except BaseException as exc:
        # a refusal (409; pyiceberg's validation after its retries) or a failure before anything was sent; a
        # manifest past the limits is read only before a commit is sent or on a retry after a 409: none landed
        refused = isinstance(exc, (CommitFailedException, ValidationException, ManifestLimitError))
        if commit is not None and (refused or not commit.table.commit_sent):
            commit.delete_written()
        typed = _typed(exc, loaded, sent=commit is not None and commit.table.commit_sent)
        if typed is exc:
            raise
        raise typed from None


def _typed(exc: BaseException, loaded: LoadedTable, *, sent: bool) -> BaseException:
    if isinstance(exc, SQEError) or not isinstance(exc, Exception):  # ours, or a cancellation or interrupt
        return exc
    what = f"commit to {loaded.ident}"
    if isinstance(exc, PYICEBERG_CATALOG_ERRORS):  # 409 on a concurrent commit: CommitConflictError
        error = translate_error(exc, what)
        if sent and (error.status or 0) >= 500:  # a 503 too (as Iceberg's Java client): the commit may have run
            return (
                error
                if isinstance(error, CommitStateUnknownError)
                else commit_state_unknown(what, str(error), error.status)
            )
        return error
    if sent and isinstance(exc, requests.RequestException):  # no answer (a timeout, a dropped connection)
        return commit_state_unknown(what, f"{type(exc).__name__}: {first_line(exc)}")
    if isinstance(exc, ValidationException):
        # pyiceberg's message lists the conflicting file with its column bounds: raw values, never shown
        return CommitConflictError(
            f"conflict on commit to {loaded.ident}: a concurrent commit changed rows this statement rewrites", 409
        )
    return QueryError(f"writing to {loaded.ident} failed: {first_line(exc)}")
