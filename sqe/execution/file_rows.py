"""A Parquet data file is read as exactly the rows its footer and its manifest entry state, or refused.

pyarrow reads no more rows than a row group's footer states, and no more than its pages hold: a row group whose
``num_rows`` understated its pages' rows (or overstated them) read short without error, and the scan's bounds
(whole-group reads, batch sizes, the decoded-column cache's share) trust that count. So every reader of a data
file (the direct scan, the decoded-column cache's decoders, the Iceberg projection of files with deletes or
evolved columns, OPTIMIZE's rewrite) first holds the footer to itself and to the manifest entry
(:func:`check_file_rows`), then counts the rows each row group yields (:func:`group_batches`): a file that
disagrees fails the query with ``DataFileError`` (a ``QueryError``). Counting costs one comparison a batch.

An ORC data file, read by pyiceberg's own reader, is held to its manifest entry by its footer alone
(:func:`check_orc_file_rows`: the footer's count, its stripes' and the entry's agree); its stripes' rows are not
counted as they are read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.orc as orc

from sqe.errors import DataFileError
from sqe.execution import orc_footer

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    import pyarrow.parquet as pq
    from pyiceberg.io import FileIO

_REFUSED = "cannot read a data file of the table"


def check_file_rows(metadata: pq.FileMetaData, record_count: int | None) -> None:
    """Refuse a footer that disagrees with itself or with the manifest entry's ``record_count`` (None: no entry).

    A file whose entry states other rows than its footer holds other rows than the table's metadata promises
    (and answers ``count(*)`` from): its row groups' stated rows are what a read yields, so they must add up to
    the footer's count and that to the entry's."""
    check_row_group_rows(metadata)
    stated = sum(metadata.row_group(index).num_rows for index in range(metadata.num_row_groups))
    if metadata.num_rows != stated:
        raise DataFileError(f"{_REFUSED}: its footer states {metadata.num_rows} rows, its row groups {stated}")
    if record_count is not None and record_count != metadata.num_rows:
        footer = metadata.num_rows
        raise DataFileError(f"{_REFUSED}: its manifest entry states {record_count} rows, its footer {footer}")


def check_orc_file_rows(io: FileIO, path: str, record_count: int | None) -> None:
    """Refuse an ORC data file whose footer's count, its stripes' (what pyarrow reads) and the manifest entry's
    ``record_count`` (None: no entry) disagree, read from the file's tail before any stripe is decoded."""
    try:
        with io.new_input(path).open() as stream:
            tail = orc.ORCFile(stream).reader.serialized_file_tail()
        rows = orc_footer.stated_rows(tail)
    except ValueError:  # a tail pyarrow took but the footer reader cannot (pyarrow's own refusals are OSErrors)
        raise DataFileError(f"{_REFUSED}: it is not an ORC file whose footer states its rows") from None
    if rows.footer != rows.stripes:
        raise DataFileError(f"{_REFUSED}: its footer states {rows.footer} rows, its stripes {rows.stripes}")
    if record_count is not None and record_count != rows.footer:
        raise DataFileError(f"{_REFUSED}: its manifest entry states {record_count} rows, its footer {rows.footer}")


def check_row_group_rows(metadata: pq.FileMetaData) -> None:
    """Refuse a file whose row group states other rows than its column chunks' values. A column chunk of a
    column that repeats nothing holds one value (or null) a row."""
    flat = [i for i in range(metadata.num_columns) if metadata.schema.column(i).max_repetition_level == 0]
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        stated = group.num_rows
        for column in flat:
            values = group.column(column).num_values
            if values != stated:
                raise DataFileError(
                    f"{_REFUSED}: its row group {index} states {stated} rows, its column chunk {column} {values} values"
                )


def check_group_rows(index: int, stated: int, read_rows: int, *, done: bool) -> None:
    """Refuse a row group read past the rows it states, or ending short of them (``done``)."""
    if read_rows > stated or (done and read_rows != stated):
        raise DataFileError(
            f"{_REFUSED}: its row group {index} states {stated} rows, its pages held "
            f"{'more' if read_rows > stated else read_rows}"
        )


def group_batches(
    fragment: ds.ParquetFileFragment,
    groups: Sequence[int],
    columns: list[str] | dict[str, ds.Expression],
    rows: int,
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """The batches of the row groups ``groups`` (in file order), each with its group's index, decoded by the
    dataset scanner (groups in parallel) in batches of at most ``rows`` rows, unfiltered: ``columns`` may add an
    expression's column (a row filter's mask) that the caller filters by.

    Each group is scanned as its own fragment, so every batch is known to be of its group: a group that yields
    other rows than it states is refused before any batch of the next group is handed on, and no batch of one
    group is ever taken for another's (which cutting one scan's batches at the stated counts would do)."""
    if not groups:
        return
    metadata = fragment.metadata
    parts = [fragment.subset(row_group_ids=[index]) for index in groups]
    dataset = ds.FileSystemDataset(parts, fragment.physical_schema, fragment.format, fragment.filesystem)
    scanner = ds.Scanner.from_dataset(dataset, columns=columns, batch_size=rows, use_threads=True)
    order = {index: position for position, index in enumerate(groups)}
    position, read_rows = 0, 0
    for tagged in scanner.scan_batches():
        index = tagged.fragment.row_groups[0].id
        if order.get(index, -1) < position:  # never seen: the scanner keeps file order
            raise DataFileError(f"{_REFUSED}: its row group {index} was read out of order")
        while groups[position] != index:  # the scan moved on: the group it left is complete, or refused
            check_group_rows(groups[position], metadata.row_group(groups[position]).num_rows, read_rows, done=True)
            position, read_rows = position + 1, 0
        read_rows += tagged.record_batch.num_rows
        check_group_rows(index, metadata.row_group(index).num_rows, read_rows, done=False)
        yield index, tagged.record_batch
    for index in groups[position:]:  # the last group scanned, and any that yielded nothing at all
        check_group_rows(index, metadata.row_group(index).num_rows, read_rows, done=True)
        read_rows = 0


def filtered(batch: pa.RecordBatch, mask: str | None, schema: pa.Schema) -> pa.RecordBatch:
    """The batch's rows whose ``mask`` column (its last) is true, a null dropping the row as a scanner's filter
    does, as ``schema`` (its columns before the mask; a projected column loses its field's metadata)."""
    if mask is not None:
        batch = batch.filter(batch.column(mask)).drop_columns([mask])
    if not schema:  # no column (a row count): built from no arrays, a batch would hold no rows
        return batch.select([])
    return pa.RecordBatch.from_arrays(batch.columns, schema=schema)


def scan_columns(
    names: Sequence[str], row_filter: ds.Expression | None, physical_schema: pa.Schema
) -> tuple[list[str] | dict[str, ds.Expression], str | None]:
    """What :func:`group_batches` reads for ``names`` under ``row_filter``: the columns, and the name of the
    filter's mask column (None: no filter). The scanner evaluates the filter as it would to filter, but keeps
    every row, so they can be counted."""
    if row_filter is None:
        return list(names), None
    mask = mask_name(physical_schema)
    return {**{name: ds.field(name) for name in names}, mask: row_filter}, mask


def mask_name(schema: pa.Schema) -> str:
    """A column name for a row filter's mask that the file's schema does not hold."""
    name = "__sqe_row_mask"
    while schema.get_field_index(name) >= 0 or name in schema.names:
        name += "_"
    return name
