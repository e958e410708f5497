"""The Avro container walk that sizes a manifest before planning reads it (``sqe.planning.avro_limits``)."""

from __future__ import annotations

import bz2
import importlib.util
import zlib

import pytest
import zstandard

from sqe.errors import ManifestLimitError
from sqe.planning.avro_limits import MalformedAvroError, ManifestBounds, UnreadableCodecError, inflated_size
from tests.helpers.avro import avro_container, avro_long

PLAIN = b"x" * 300_000


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
