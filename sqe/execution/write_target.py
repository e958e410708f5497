"""What a write may take from a table's properties: where data files go, never which code runs.

pyiceberg reads two things from table properties when it writes: ``write.py-location-provider.impl`` names a
class it imports and instantiates, and ``write.data.path`` says where data files go. A catalog that lets any
writer set properties (sqe-catalog refuses both; another catalog may not) would let one user run an importable
class inside the engine (in ``sqe serve``, a process holding the reader's secret) or steer SQE's writes into
another table's files. So every write goes through :func:`writable_table`: the class-naming properties are
dropped, and a data or metadata path outside the table's location is used only when a credential the catalog
vended for this table covers it (the catalog's scope then decides); with SQE's own key it is refused.

pyiceberg refreshes the table and writes its manifests again when a commit conflicts, so the table a write
uses is a :class:`WriteTable`: it applies both rules again to every metadata it holds, refreshed ones included.
It also never deletes the old metadata files a table property asks pyiceberg to delete after a commit, and its
``io`` reads the previous manifest list and manifests within the planning limits (a writer of the table decides
what they hold); ``files_io`` is the table's own FileIO, for data files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.update import AddSnapshotUpdate

from sqe._text import first_line
from sqe.credentials import prefix_matches
from sqe.errors import QueryError
from sqe.planning.avro_limits import CommitIO, ManifestBounds, table_bounds

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pyiceberg.io import FileIO
    from pyiceberg.table.locations import LocationProvider
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.table.update import TableRequirement, TableUpdate

    from sqe.catalog.base import LoadedTable, TableIdent

__all__ = ["WriteTable", "check_data_path", "data_path", "writable_table"]

# The newest table format SQE's writer (pyiceberg 0.12's manifest writer) produces.
MAX_WRITE_FORMAT_VERSION = 2
# Properties that name a class pyiceberg would import (the FileIO one is never used by SQE: dropped all the same).
_CLASS_PROPERTIES = frozenset({TableProperties.WRITE_PY_LOCATION_PROVIDER_IMPL, "py-io-impl"})


def writable_table(loaded: LoadedTable) -> WriteTable:
    """``loaded.table`` as every SQE write uses it: its paths checked, class-naming properties dropped."""
    return WriteTable(loaded)


class WriteTable(Table):
    """A table whose location provider never comes from a class a property names, and whose data and metadata
    paths are checked whenever one is asked for (pyiceberg asks again after refreshing on a commit conflict)."""

    def __init__(self, loaded: LoadedTable) -> None:
        table = loaded.table
        metadata = _without_class_properties(table.metadata)
        super().__init__(table.name(), metadata, table.metadata_location, table.io, table.catalog, table.config)
        self._ident = loaded.ident
        self.commit_sent = False  # whether a commit request may have reached the catalog
        _check_format_version(self._ident, metadata)  # before any file is written
        _check_paths(self._ident, metadata, table.io)
        self.files_io: FileIO = table.io
        self._commit_io = CommitIO(self.files_io, self._bounds())
        self.io = self._commit_io

    def location_provider(self) -> LocationProvider:
        metadata = _without_class_properties(self.metadata)
        _check_paths(self._ident, metadata, self.files_io)
        return load_location_provider(table_location=metadata.location, table_properties=metadata.properties)

    def refresh(self) -> Table:
        super().refresh()  # the catalog's FileIO for the refreshed table replaces ours
        self.metadata = _without_class_properties(self.metadata)
        self.files_io = self.io
        # the same CommitIO, which the producers of a retried commit hold: around the new FileIO, naming the
        # refreshed snapshots' manifest lists
        self._commit_io.rebind(self.files_io, self._bounds())
        self.io = self._commit_io
        return self

    def _bounds(self) -> ManifestBounds:
        return table_bounds(f"cannot commit to {self._ident}", self.metadata)

    def _do_commit(self, updates: tuple[TableUpdate, ...], requirements: tuple[TableRequirement, ...]) -> None:
        """pyiceberg's commit without its clean-up: with ``write.metadata.delete-after-commit.enabled`` it deletes
        every ``metadata-log`` entry the commit trimmed, and a table's log is whatever its writers put there
        (another table's metadata, a local file of the engine's host). Old metadata is the catalog's to remove."""
        self.commit_sent = True
        try:
            response = self.catalog.commit_table(self, requirements, updates)
            metadata, location = response.metadata, response.metadata_location
        except CommitFailedException:
            # A 409 may answer a resend of a commit that landed (its first answer lost): then the caller must
            # not delete what it wrote for it (pyiceberg its manifests, SQE its data files).
            landed = self._landed(updates)
            if landed is None:
                raise
            metadata, location = landed.metadata, landed.metadata_location
        except Exception:
            # No answer, a 5xx, or any answer to a resend (the transport resends on a 503 with Retry-After or a
            # 429): the commit may have landed. When the table shows it did, the statement succeeded (reported
            # failed, it would be run again and write its rows twice); else the error stands.
            try:
                landed = self._landed(updates)
            except CommitStateUnknownException:
                landed = None
            if landed is None:
                raise
            metadata, location = landed.metadata, landed.metadata_location
        self._check_uuid(self.metadata, metadata)
        self.metadata = _without_class_properties(metadata)
        self.metadata_location = location

    def _landed(self, updates: tuple[TableUpdate, ...]) -> Table | None:
        """The table as the catalog has it now when every snapshot ``updates`` add is in it, else None."""
        added = [update.snapshot.snapshot_id for update in updates if isinstance(update, AddSnapshotUpdate)]
        if not added:
            return None
        try:
            current = self.catalog.load_table(self._identifier)
        except Exception as exc:  # unknown: never report a commit that may have landed as one that did not
            raise CommitStateUnknownException(f"commit outcome unknown: {first_line(exc)}") from None
        if all(current.metadata.snapshot_by_id(snapshot_id) is not None for snapshot_id in added):
            return current
        return None


def _without_class_properties(metadata: TableMetadata) -> TableMetadata:
    kept = {key: value for key, value in metadata.properties.items() if key not in _CLASS_PROPERTIES}
    if len(kept) == len(metadata.properties):
        return metadata
    return metadata.model_copy(update={"properties": kept})


def _check_format_version(ident: TableIdent, metadata: TableMetadata) -> None:
    """pyiceberg writes v1/v2 manifests only: a v3 table's write would fail at its commit, its files written."""
    if metadata.format_version > MAX_WRITE_FORMAT_VERSION:
        raise QueryError(
            f"cannot write to {ident}: it is an Iceberg format-version {metadata.format_version} table, and SQE "
            f"writes format-version {MAX_WRITE_FORMAT_VERSION} at most (reading it works)"
        )


def _check_paths(ident: TableIdent, metadata: TableMetadata, io: FileIO) -> None:
    properties = metadata.properties
    _check_path(ident, metadata.location, io, data_path(metadata.location, properties), "write.data.path")
    _check_path(ident, metadata.location, io, _metadata_path(metadata.location, properties), "write.metadata.path")


def data_path(location: str, properties: Mapping[str, str]) -> str:
    """Where pyiceberg's own location providers put data files: ``write.data.path``, else ``<location>/data``."""
    return (properties.get(TableProperties.WRITE_DATA_PATH) or f"{location.rstrip('/')}/data").rstrip("/")


def _metadata_path(location: str, properties: Mapping[str, str]) -> str:
    """Where pyiceberg puts manifests and manifest lists: ``write.metadata.path``, else ``<location>/metadata``."""
    return (properties.get(TableProperties.WRITE_METADATA_PATH) or f"{location.rstrip('/')}/metadata").rstrip("/")


def check_data_path(loaded: LoadedTable, path: str) -> None:
    """Refuse a data path outside the table's location unless a vended credential of this table covers it."""
    _check_path(loaded.ident, loaded.table.metadata.location, loaded.io, path, "write.data.path")


def _check_path(ident: TableIdent, location: str, io: FileIO, path: str, what: str) -> None:
    _, _, rest = path.partition("://")
    if any(segment in {".", ".."} for segment in (rest or path).split("/")):
        # a local file system resolves them, and prefix matching does not: never a way out of the location
        raise QueryError(f"writing to {ident} refused: its {what} {path} has a '.' or '..' segment")
    if prefix_matches(path, location):
        return
    from sqe.credentials.fileio import ScopedFileIO  # imports pyarrow's FileIO: loaded when a write needs it

    covering = io.set_for(path) if isinstance(io, ScopedFileIO) else None  # other FileIOs vouch for nothing
    if covering is not None and covering.source == "vended":
        return
    raise QueryError(
        f"writing to {ident} refused: its {what} {path} is outside the table location and no "
        "credential the catalog vended for the table covers it (SQE's own key never writes outside a table)"
    )
