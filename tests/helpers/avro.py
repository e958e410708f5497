"""Hand-encoded Avro pieces for tests that build (broken or hostile) Avro container files."""

from __future__ import annotations


def avro_long(value: int) -> bytes:
    """An Avro long: zigzag, then a little-endian base-128 varint."""
    encoded, out = (value << 1) ^ (value >> 63), bytearray()
    while encoded > 0x7F:
        out.append((encoded & 0x7F) | 0x80)
        encoded >>= 7
    return bytes([*out, encoded])
