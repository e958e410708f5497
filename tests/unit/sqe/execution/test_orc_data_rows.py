"""An ORC data file is read only when its footer's rows, its stripes' and its manifest entry's agree
(``sqe.execution.file_rows.check_orc_file_rows``, before pyiceberg's reader decodes a stripe).

Real files written by pyarrow (uncompressed, so a footer count can be restated in place), added to a local table
with a name mapping (pyarrow writes no Iceberg field ids into ORC).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.orc as orc
import pytest
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table.name_mapping import create_mapping_from_schema
from pyiceberg.typedef import Record

from sqe.catalog.base import TableIdent
from sqe.errors import DataFileError
from sqe.execution import local
from sqe.execution.orc_footer import OrcRows, stated_rows
from sqe.planning.planner import ScanPlan, plan_scan
from tests.unit.sqe.iceberg_local import NUMBERS_SCHEMA, numbers_batch

if TYPE_CHECKING:
    from tests.unit.sqe.iceberg_local import LocalProvider

ROWS = 1000
TABLE = TableIdent("wh", ("ns",), "orc_rows")
FOOTER_ROWS = b"\x30\xe8\x07"  # the footer's numberOfRows (field 6, a varint): 1000
RESTATED_ROWS = b"\x30\xed\x07"  # 1005, in as many bytes


def _orc_file(rows: int = ROWS) -> bytes:
    sink = pa.BufferOutputStream()
    orc.write_table(numbers_batch(0, rows), sink, compression="uncompressed")
    return bytes(sink.getvalue().to_pybytes())


def _tail(data: bytes) -> bytes:
    return bytes(orc.ORCFile(pa.BufferReader(data)).reader.serialized_file_tail())


def _plan(provider: LocalProvider, data: bytes, record_count: int = ROWS) -> ScanPlan:
    """A table of one ORC data file holding ``data``, its manifest entry stating ``record_count`` rows."""
    table = provider.catalogs["wh"].create_table("ns.orc_rows", schema=NUMBERS_SCHEMA)
    path = f"{table.location()}/data/{uuid.uuid4()}.orc"
    with table.io.new_output(path).create() as out:
        out.write(data)
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.ORC,
        partition=Record(),
        record_count=record_count,
        file_size_in_bytes=len(data),
    )
    data_file.spec_id = table.spec().spec_id
    with table.transaction() as tx:
        tx.set_properties({"schema.name-mapping.default": create_mapping_from_schema(table.schema()).model_dump_json()})
        with tx.update_snapshot().fast_append() as append:
            append.append_data_file(data_file)
    plan = plan_scan(provider.load_table(TABLE), columns=None)
    assert len(plan.tasks) == 1 and plan.tasks[0].file.file_format == FileFormat.ORC
    return plan


def _rows(plan: ScanPlan) -> int:
    return sum(batch.num_rows for batch in local._task_to_record_batches(plan.read, plan.tasks[0], None))


def test_the_tail_states_the_footers_rows_and_the_stripes() -> None:
    assert stated_rows(_tail(_orc_file())) == OrcRows(footer=ROWS, stripes=ROWS)


def test_an_orc_data_file_agreeing_with_its_entry_is_read(write_provider: LocalProvider) -> None:
    assert _rows(_plan(write_provider, _orc_file())) == ROWS


def test_an_orc_data_file_holding_other_rows_than_its_entry_states_is_refused(write_provider: LocalProvider) -> None:
    # Before: the scan read all 1,000 rows of a file whose entry (and so count(*) from metadata) said 500.
    plan = _plan(write_provider, _orc_file(), record_count=500)
    with pytest.raises(DataFileError) as raised:
        _rows(plan)
    assert str(raised.value) == (
        f"cannot read a data file of the table: its manifest entry states 500 rows, its footer {ROWS}"
    )


def test_an_orc_footer_disagreeing_with_its_stripes_is_refused(write_provider: LocalProvider) -> None:
    data = _orc_file()
    assert data.count(FOOTER_ROWS) == 1
    restated = data.replace(FOOTER_ROWS, RESTATED_ROWS)
    assert stated_rows(_tail(restated)) == OrcRows(footer=ROWS + 5, stripes=ROWS)
    plan = _plan(write_provider, restated, record_count=ROWS + 5)  # the entry agrees with the footer, not the stripes
    with pytest.raises(DataFileError) as raised:
        _rows(plan)
    assert str(raised.value) == (
        f"cannot read a data file of the table: its footer states {ROWS + 5} rows, its stripes {ROWS}"
    )
