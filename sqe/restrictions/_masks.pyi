# The C string masks (_masks.c); string_masks.py is their only caller.
from typing_extensions import Buffer

def mask_strings(
    data: Buffer,
    offsets: Buffer,
    width: int,
    first: int,
    length: int,
    validity: Buffer | None,
    validity_bit: int,
    keep_first: int,
    keep_last: int,
    out: Buffer,
    out_offsets: Buffer,
    /,
) -> int: ...
def set_compacting(enabled: bool, /) -> bool: ...
def floor_through_table(
    values: Buffer, first: int, length: int, per_day: int, table: Buffer, table_first_day: int, out: Buffer, /
) -> bool: ...
