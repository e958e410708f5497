"""Hand-encoded Avro pieces for tests that build (broken or hostile) Avro container files."""

from __future__ import annotations


def avro_long(value: int) -> bytes:
    """An Avro long: zigzag, then a little-endian base-128 varint."""
    encoded, out = (value << 1) ^ (value >> 63), bytearray()
    while encoded > 0x7F:
        out.append((encoded & 0x7F) | 0x80)
        encoded >>= 7
    return bytes([*out, encoded])


AVRO_SYNC = bytes(range(16))


def avro_container(codec: bytes, *blocks: bytes) -> bytes:
    """An Avro container file naming ``codec``, with each of ``blocks`` (already compressed) as one block."""
    meta = avro_long(1) + avro_long(10) + b"avro.codec" + avro_long(len(codec)) + codec + avro_long(0)
    framed = (avro_long(1) + avro_long(len(b)) + b + AVRO_SYNC for b in blocks)
    return b"Obj\x01" + meta + AVRO_SYNC + b"".join(framed)
