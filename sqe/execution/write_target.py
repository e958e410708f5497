"""What a write may take from a table's properties: where data files go, never which code runs.

pyiceberg reads two things from table properties when it writes: ``write.py-location-provider.impl`` names a
class it imports and instantiates, and ``write.data.path`` says where data files go. A catalog that lets any
writer set properties (sqe-catalog refuses both; another catalog may not) would let one user run an importable
class inside the engine (in ``sqe serve``, a process holding the reader's secret) or steer SQE's writes into
another table's files. So every write goes through :func:`writable_table`: the class-naming properties are
dropped, and a data path outside the table's location is used only when a credential the catalog vended for
this table covers it (the catalog's scope then decides); with SQE's own key it is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyiceberg.table import Table, TableProperties

from sqe.credentials import prefix_matches
from sqe.errors import QueryError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sqe.catalog.base import LoadedTable

__all__ = ["check_data_path", "data_path", "writable_table"]

# Properties that name a class pyiceberg would import (the FileIO one is never used by SQE: dropped all the same).
_CLASS_PROPERTIES = frozenset({TableProperties.WRITE_PY_LOCATION_PROVIDER_IMPL, "py-io-impl"})


def writable_table(loaded: LoadedTable) -> Table:
    """``loaded.table`` as every SQE write uses it: its data path checked, class-naming properties dropped."""
    metadata = loaded.table.metadata
    check_data_path(loaded, data_path(metadata.location, metadata.properties))
    kept = {key: value for key, value in metadata.properties.items() if key not in _CLASS_PROPERTIES}
    if len(kept) == len(metadata.properties):
        return loaded.table
    table = loaded.table
    stripped = metadata.model_copy(update={"properties": kept})
    return Table(table.name(), stripped, table.metadata_location, table.io, table.catalog)


def data_path(location: str, properties: Mapping[str, str]) -> str:
    """Where pyiceberg's own location providers put data files: ``write.data.path``, else ``<location>/data``."""
    return (properties.get(TableProperties.WRITE_DATA_PATH) or f"{location.rstrip('/')}/data").rstrip("/")


def check_data_path(loaded: LoadedTable, path: str) -> None:
    """Refuse a data path outside the table's location unless a vended credential of this table covers it."""
    if prefix_matches(path, loaded.table.metadata.location):
        return
    from sqe.credentials.fileio import ScopedFileIO  # imports pyarrow's FileIO: loaded when a write needs it

    covering = loaded.io.set_for(path) if isinstance(loaded.io, ScopedFileIO) else None  # others vouch for nothing
    if covering is not None and covering.source == "vended":
        return
    raise QueryError(
        f"writing to {loaded.ident} refused: its write.data.path {path} is outside the table location and no "
        "credential the catalog vended for the table covers it (SQE's own key never writes outside a table)"
    )
