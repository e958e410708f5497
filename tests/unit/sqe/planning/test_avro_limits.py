"""The Avro container walk that sizes a manifest before planning reads it (``sqe.planning.avro_limits``)."""

from __future__ import annotations

import bz2
import importlib.util
import random
import zlib
from typing import TYPE_CHECKING

import pytest
import zstandard
from pyiceberg.manifest import clear_manifest_cache

from sqe.errors import ManifestLimitError
from sqe.planning.avro_limits import (
    MalformedAvroError,
    ManifestBounds,
    UnreadableCodecError,
    bounded_table,
    inflated_size,
)
from tests.helpers.avro import Inflations, avro_container, avro_long
from tests.unit.sqe.iceberg_local import NUMBERS_SCHEMA, local_catalog, numbers_batch

if TYPE_CHECKING:
    from pathlib import Path

PLAIN = b"x" * 300_000
NOISE = random.Random(0).randbytes(100_000)  # compresses to about its size


def _deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, -15)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize(
    ("codec", "compress"),
    [
        (b"null", lambda d: d),
        (b"deflate", _deflate),
        (b"bzip2", bz2.compress),
        (b"zstandard", lambda d: zstandard.ZstdCompressor().compress(d)),
    ],
)
def test_each_codec_counts_its_inflated_blocks_and_stops_past_the_budget(codec: bytes, compress: object) -> None:
    assert callable(compress)
    data = avro_container(codec, compress(PLAIN), compress(PLAIN[:1000]))
    assert inflated_size(data, 10 * len(PLAIN)) == len(PLAIN) + 1000
    assert len(PLAIN) // 2 < inflated_size(data, len(PLAIN) // 2) <= len(PLAIN) + 1000  # past it: stops counting


def test_snappy_is_sized_by_the_length_it_states_when_pyiceberg_can_read_it() -> None:
    # a snappy block starts with its inflated length (an unsigned varint) and Avro adds a CRC-32 after it
    block = bytes([0x80, 0x80, 0x80, 0x80, 0x01]) + b"\0" * 8
    if importlib.util.find_spec("snappy") is None:  # pyiceberg's snappy codec would raise ImportError
        with pytest.raises(UnreadableCodecError):
            inflated_size(avro_container(b"snappy", block), 1)
    else:
        assert inflated_size(avro_container(b"snappy", block), 1) == 1 << 28


def test_a_codec_pyiceberg_cannot_read_is_refused_naming_the_readable_ones() -> None:
    # Before: it counted nothing, and pyiceberg then failed with an untyped ValueError.
    with pytest.raises(ManifestLimitError) as raised:
        ManifestBounds().checked("s3://b/m.avro", avro_container(b"brotli", b"x" * 10))
    assert str(raised.value) == (
        "cannot plan this scan: a manifest list or manifest of the table is written with an Avro codec SQE cannot "
        "read (it reads null, deflate, bzip2, zstandard"
        + (", snappy" if importlib.util.find_spec("snappy") else "")
        + ")"
    )


@pytest.mark.parametrize(
    "data",
    [
        b"PAR1",  # not Avro
        avro_container(b"deflate", _deflate(PLAIN))[:-20],  # a block cut short
        avro_container(b"deflate", b"\xff" * 64),  # a corrupt deflate stream
        b"Obj\x01" + avro_long(1) + avro_long(1000),  # a header cut short
        b"Obj\x01" + avro_long(0) + b"\0" * 8,  # a sync marker cut short (pyiceberg read past the buffer's end)
    ],
)
def test_a_file_that_is_not_an_avro_container_is_malformed(data: bytes) -> None:
    with pytest.raises(MalformedAvroError):
        inflated_size(data, 1 << 30)


def test_a_bzip2_block_of_several_streams_counts_them_all() -> None:
    # Before: the walk stopped at the first stream's end, but pyiceberg's bzip2 codec (bz2.decompress) inflates
    # every stream of a block: a tiny first stream hid any size after it.
    block = bz2.compress(b"x") + bz2.compress(PLAIN) + b"\0\0"  # trailing bytes that are no stream are ignored
    assert inflated_size(avro_container(b"bzip2", block), 10 * len(PLAIN)) == 1 + len(PLAIN)
    assert inflated_size(avro_container(b"bzip2", block), len(PLAIN) // 2) > len(PLAIN) // 2


@pytest.mark.parametrize(
    ("codec", "block"),
    [
        (b"deflate", _deflate(PLAIN)[:-100]),
        (b"bzip2", bz2.compress(NOISE)[:-100]),
        (b"bzip2", bz2.compress(b"x") + bz2.compress(NOISE)[:-100]),  # a later stream cut short
    ],
    ids=["deflate", "bzip2", "bzip2-second-stream"],
)
def test_a_block_cut_short_within_its_frame_is_refused(codec: bytes, block: bytes) -> None:
    # Before: the walk counted what the stream held so far and passed it; pyiceberg's codec then raised
    # zlib.error (no ValueError or OSError: planning failed untyped) or bzip2's ValueError.
    with pytest.raises(ManifestLimitError) as raised:
        ManifestBounds().checked("s3://b/m.avro", avro_container(codec, block))
    assert str(raised.value).endswith("a manifest list or manifest of the table is not an Avro container file")


@pytest.mark.parametrize(("codec", "check"), [("deflate", "zlib.decompressobj"), ("bzip2", "bz2.BZ2Decompressor")])
def test_a_bounded_read_inflates_each_block_once_and_decodes_the_same_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, codec: str, check: str
) -> None:
    # Before: each block was inflated twice, once to count it and once more by pyiceberg's codec.
    catalog = local_catalog(tmp_path, "wh")
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.t", schema=NUMBERS_SCHEMA, properties={"write.avro.compression-codec": codec})
    for start in range(0, 30, 10):
        table.append(numbers_batch(start, 10))
    snapshot = table.current_snapshot()
    assert snapshot is not None
    files = 1 + len(snapshot.manifests(table.io))  # the manifest list, then each manifest: one block each here
    expected = sorted(task.file.file_path for task in table.scan().plan_files())

    inflations = Inflations(monkeypatch)
    clear_manifest_cache()
    planned = sorted(task.file.file_path for task in bounded_table(table, "cannot plan").scan().plan_files())
    assert planned == expected and len(planned) == 3
    assert inflations.calls == {check: files}  # the check's inflation only: pyiceberg decodes its blocks
