"""Hand-encoded Avro pieces for tests that build (broken or hostile) Avro container files."""

from __future__ import annotations

import bz2
import json
import threading
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest


def avro_long(value: int) -> bytes:
    """An Avro long: zigzag, then a little-endian base-128 varint."""
    encoded, out = (value << 1) ^ (value >> 63), bytearray()
    while encoded > 0x7F:
        out.append((encoded & 0x7F) | 0x80)
        encoded >>= 7
    return bytes([*out, encoded])


AVRO_SYNC = bytes(range(16))


def avro_container(codec: bytes, *blocks: bytes, schema: bytes | None = None) -> bytes:
    """An Avro container file naming ``codec`` (and ``schema``, when given), with each of ``blocks`` (already
    compressed) as one block of one record."""
    entries = {b"avro.codec": codec} if schema is None else {b"avro.codec": codec, b"avro.schema": schema}
    pairs = (avro_long(len(part)) + part for entry in entries.items() for part in entry)
    meta = avro_long(len(entries)) + b"".join(pairs) + avro_long(0)
    framed = (avro_long(1) + avro_long(len(b)) + b + AVRO_SYNC for b in blocks)
    return b"Obj\x01" + meta + AVRO_SYNC + b"".join(framed)


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    return bytes([*out, value])


def snappy_block(data: bytes) -> bytes:
    """``data`` as an Avro snappy block, in literals only (any snappy decoder reads it), then its CRC-32."""
    out = bytearray(_uvarint(len(data)))
    for start in range(0, len(data), 1 << 16):
        chunk = data[start : start + (1 << 16)]
        out += bytes([62 << 2]) + (len(chunk) - 1).to_bytes(3, "little") + chunk  # tag 62: a 3-byte length
    return bytes(out) + zlib.crc32(data).to_bytes(4, "big")


def recoded(
    avro: bytes, codec: bytes, encode: Callable[[bytes], bytes], schema: Callable[[Any], None] | None = None
) -> bytes:
    """The null-codec container ``avro`` with its header naming ``codec`` and each block passed to ``encode``;
    its header's schema (JSON) changed in place by ``schema``, when given."""
    from sqe.planning.avro_limits import _bytes, _long

    pos, meta = 4, {}
    while (count := _long(avro, pos))[0]:
        pos = count[1]
        for _ in range(count[0]):
            key, pos = _bytes(avro, pos)
            meta[key], pos = _bytes(avro, pos)
    pos = count[1]
    assert meta.get(b"avro.codec", b"null") == b"null", meta.get(b"avro.codec")
    sync, pos = avro[pos : pos + 16], pos + 16
    meta[b"avro.codec"] = codec
    if schema is not None:
        changed = json.loads(meta[b"avro.schema"])
        schema(changed)
        meta[b"avro.schema"] = json.dumps(changed).encode()
    out = bytearray(b"Obj\x01" + avro_long(len(meta)))
    for key, value in meta.items():
        out += avro_long(len(key)) + key + avro_long(len(value)) + value
    out += avro_long(0) + sync
    while pos < len(avro):
        records, pos = _long(avro, pos)
        size, pos = _long(avro, pos)
        block = encode(avro[pos : pos + size])
        out += avro_long(records) + avro_long(len(block)) + block + sync
        pos += size + 16
    return bytes(out)


class Inflations:
    """Calls of the standard library's decompressors for Avro's deflate (raw) and bzip2 blocks, counted as they
    pass through to the real ones (pyiceberg's codecs and the manifest limit check both inflate through them)
    while ``monkeypatch`` is in force: ``calls`` maps ``zlib.decompress`` and the like to a count."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()  # planning reads manifests on several threads
        for module, name in ((zlib, "decompress"), (zlib, "decompressobj"), (bz2, "decompress")):
            monkeypatch.setattr(module, name, self._counted(f"{module.__name__}.{name}", getattr(module, name)))
        monkeypatch.setattr(bz2, "BZ2Decompressor", self._counted("bz2.BZ2Decompressor", bz2.BZ2Decompressor))

    def _counted(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if not name.startswith("zlib") or -15 in args:  # Avro's raw deflate only, no HTTP body's gzip
                with self._lock:
                    self.calls[name] = self.calls.get(name, 0) + 1
            return real(*args, **kwargs)

        return call


def avro_blocks(avro: bytes) -> tuple[bytes, list[tuple[int, bytes]]]:
    """An Avro container's header (up to and with its sync marker) and its blocks, each as (record count, bytes
    as stored); any codec: blocks are split by their framing, not inflated."""
    from sqe.planning.avro_limits import _header, _long

    _meta, sync, pos = _header(avro)
    header, blocks = avro[:pos], []
    while pos < len(avro):
        count, pos = _long(avro, pos)
        size, pos = _long(avro, pos)
        blocks.append((count, avro[pos : pos + size]))
        pos += size + len(sync)
    return header, blocks


def avro_with_blocks(header: bytes, blocks: list[tuple[int, bytes]]) -> bytes:
    """The container of ``header`` (from :func:`avro_blocks`) and ``blocks``, each followed by its sync marker."""
    sync = header[-16:]
    return header + b"".join(avro_long(count) + avro_long(len(data)) + data + sync for count, data in blocks)


def reblocked(avro: bytes, change: Callable[[list[tuple[int, bytes]]], list[tuple[int, bytes]]]) -> bytes:
    """The container ``avro`` with its blocks (record count, bytes as stored) replaced by ``change(blocks)``."""
    header, blocks = avro_blocks(avro)
    return avro_with_blocks(header, change(blocks))
