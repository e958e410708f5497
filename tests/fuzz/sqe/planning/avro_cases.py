"""Mutated manifest lists and manifests read through SQE's bounded path; run by ``test_fuzz_avro_manifests`` in a
child process (``python -m tests.fuzz.sqe.planning.avro_cases DIR COUNT``; see ``tests/fuzz/subprocess_cases``).

DIR holds real files pyiceberg wrote: ``*.list.avro`` (manifest lists) and ``*.manifest.avro``. Case N mutates one
of them, chosen and changed by ``random.Random(N)``, knowing the container's structure: a value inside a block
(decompressed, changed, compressed again with the file's codec), a block's record count or size, the header's
metadata and schema, a truncation or a bit flip anywhere. Each outcome is ``refused`` (ManifestLimitError),
``undecodable`` (the errors planning reports as a manifest that does not decode) or ``decoded``, where every
string and bytes value must lie in the checked file (one read from outside it is ``bad``).
"""

from __future__ import annotations

import enum
import random
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import zstandard
from pyiceberg.manifest import ManifestFile, read_manifest_list
from pyiceberg.typedef import Record

from sqe.errors import ManifestLimitError
from sqe.planning.avro_limits import UNDECODABLE, ManifestBounds, _bytes, _long
from sqe.planning.manifests import PlanningManifest
from tests.fuzz.memory_io import BytesFile, BytesIO
from tests.fuzz.subprocess_cases import report, starting
from tests.helpers.avro import avro_long

LONGS = [0, 1, -1, 2, 127, 128, 4096, 1 << 20, 1 << 31, -(1 << 31), 1 << 62, (1 << 63) - 1, -(1 << 63)]
RETYPES = ['"null"', '{"type": "fixed", "name": "f0", "size": 0}', '"boolean"', '"bytes"', '"double"']


class _Container:
    """An Avro container taken apart: metadata, sync marker, and each block's count and inflated bytes."""

    def __init__(self, data: bytes) -> None:
        pos, self.meta = 4, {}
        while (count := _long(data, pos))[0]:
            pos = count[1]
            for _ in range(count[0]):
                key, pos = _bytes(data, pos)
                self.meta[key], pos = _bytes(data, pos)
        pos = count[1]
        self.sync, pos = data[pos : pos + 16], pos + 16
        self.blocks: list[list[Any]] = []
        while pos < len(data):
            records, pos = _long(data, pos)
            block, pos = _bytes(data, pos)
            self.blocks.append([records, _inflate(self.codec, block), None])  # None: its stated size as it is
            pos += 16

    @property
    def codec(self) -> bytes:
        return self.meta.get(b"avro.codec", b"null")

    def encoded(self) -> bytes:
        entries = (avro_long(len(part)) + part for entry in self.meta.items() for part in entry)
        out = [b"Obj\x01", avro_long(len(self.meta)), *entries, avro_long(0), self.sync]
        for records, block, size in self.blocks:
            packed = _deflate(self.codec, block)
            out += [avro_long(records), avro_long(len(packed) if size is None else size), packed, self.sync]
        return b"".join(out)


def _inflate(codec: bytes, block: bytes) -> bytes:
    if codec == b"deflate":
        return zlib.decompress(block, -15)
    return zstandard.ZstdDecompressor().stream_reader(block).read() if codec == b"zstandard" else block


def _deflate(codec: bytes, block: bytes) -> bytes:
    if codec == b"deflate":
        packer = zlib.compressobj(6, zlib.DEFLATED, -15)
        return packer.compress(block) + packer.flush()
    return zstandard.ZstdCompressor().compress(block) if codec == b"zstandard" else block


def _changed_bytes(rng: random.Random, data: bytes) -> bytes:
    """``data`` with one change: bit flips, a long written over or into it, a span cut or doubled, or a run of
    varint continuation bytes (pyiceberg's compiled decoder reads any number of them)."""
    out, at = bytearray(data), rng.randrange(max(1, len(data)))
    how = rng.randrange(6)
    if how == 0:
        for _ in range(rng.randint(1, 4)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    elif how in (1, 2):
        value = avro_long(rng.choice(LONGS))
        out[at : at + (len(value) if how == 1 else 0)] = value
    elif how == 3:
        del out[at : at + rng.randint(1, 8)]
    elif how == 4:
        out[at:at] = out[at : at + rng.randint(1, 64)]
    else:
        out[at:at] = b"\x80" * rng.choice([9, 10, 11, 64, 300])
    return bytes(out)


def _retyped(rng: random.Random, schema: bytes) -> bytes:
    """``schema`` with one primitive type somewhere in it stated as another (or one taking no bytes)."""
    text = schema.decode()
    spots = [
        i for name in ('"string"', '"long"', '"int"', '"boolean"') for i in range(len(text)) if text.startswith(name, i)
    ]
    if not spots:
        return schema
    at = rng.choice(spots)
    end = text.index('"', at + 1) + 1
    return (text[:at] + rng.choice(RETYPES) + text[end:]).encode()


def mutated(data: bytes, rng: random.Random) -> bytes:
    """``data`` (a container) changed once, as the module docstring lists."""
    container, kind = _Container(data), rng.randrange(10)
    if kind == 0:
        return _changed_bytes(rng, data)
    if kind == 1:
        return data[: rng.randrange(len(data))]
    if kind == 2:
        container.meta[b"avro.schema"] = _retyped(rng, container.meta[b"avro.schema"])
    elif kind == 3:
        key = rng.choice(sorted(container.meta))
        container.meta[key] = _changed_bytes(rng, container.meta[key])
    elif kind == 4:
        rng.choice(container.blocks)[0] = rng.choice(LONGS)
    elif kind == 5:
        block = rng.choice(container.blocks)
        block[2] = rng.choice([*LONGS, len(_deflate(container.codec, block[1])) + rng.choice([-1, 1, 16])])
    else:  # most cases: values inside a block
        block = rng.choice(container.blocks)
        for _ in range(rng.choice([1, 1, 2, 3])):
            block[1] = _changed_bytes(rng, block[1])
    return container.encoded()


def _values(found: Any) -> Iterator[bytes]:
    """Every string (UTF-8) and bytes value decoded into ``found``; an enum's name is pyiceberg's, not the file's."""
    if isinstance(found, enum.Enum):
        return
    if isinstance(found, str):
        yield found.encode("utf-8", "surrogatepass")
    elif isinstance(found, bytes):
        yield found
    elif isinstance(found, Record):
        for value in found._data:
            yield from _values(value)
    elif isinstance(found, dict):
        for key, value in found.items():
            yield from _values(key)
            yield from _values(value)
    elif isinstance(found, list | tuple):
        for value in found:
            yield from _values(value)


def _decoded(data: bytes, manifest: ManifestFile | None) -> list[Any]:
    if manifest is None:
        return list(read_manifest_list(BytesFile("s3://b/snap.avro", data)))
    entries = manifest.fetch_manifest_entry(BytesIO(data), discard_deleted=False)
    planned = PlanningManifest(*manifest._data).fetch_manifest_entry(BytesIO(data), discard_deleted=False)
    if [entry.data_file.file_path for entry in entries] != [entry.data_file.file_path for entry in planned]:
        raise AssertionError("planning's manifest reader decoded other entries than pyiceberg's")
    return entries


def outcome(data: bytes, manifest: ManifestFile | None) -> str:
    """What SQE's bounded path makes of ``data``: a manifest list (``manifest`` None) or that manifest."""
    try:
        checked = ManifestBounds().checked("s3://b/file.avro", data)
    except ManifestLimitError:
        return "refused"
    try:
        found = _decoded(checked, manifest)
    except (*UNDECODABLE, ValueError):
        return "undecodable"
    outside = [value[:40] for value in _values(found) if value not in checked]
    return f"bad: values read from outside the file: {outside[:3]}" if outside else "decoded"


def main(directory: Path, count: int) -> None:
    lists = sorted(directory.glob("*.list.avro"))
    files: list[tuple[bytes, ManifestFile | None]] = [(path.read_bytes(), None) for path in lists]
    for path in lists:  # each manifest with its record in the (unchanged) manifest list
        for manifest in read_manifest_list(BytesFile(str(path), path.read_bytes())):
            files.append((Path(manifest.manifest_path.removeprefix("file://")).read_bytes(), manifest))
    current = directory / "current-case.avro"  # a crash leaves the input that crashed here
    for case in range(count):
        starting(case)
        rng = random.Random(case)
        data, manifest = files[case % len(files)]
        changed = mutated(data, rng)
        current.write_bytes(changed)
        try:
            result = outcome(changed, manifest)
        except Exception as exc:  # anything but the typed errors above is a defect to report
            result = f"bad: {type(exc).__name__}: {exc}"[:300]
        if result.startswith("bad"):
            (directory / f"case-{case}.avro").write_bytes(changed)  # kept: the files differ per run
        report(case, result)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
