"""A bounds-checked Avro decoder for every Avro file pyiceberg decodes in an SQE process.

pyiceberg's compiled decoder (``CythonBinaryDecoder``, pyiceberg 0.12) trusts the lengths and counts a file
states: a string or bytes value whose length runs past its block is copied from the memory beyond the buffer (or
asks for a buffer of any size), and a count read from the file drives loops that read on past the end. A table's
writer chooses those bytes, so any writer could make a reader's process copy its own memory (tokens, keys) into a
decoded file path or bound, which then goes out in a request or a result. ``avro_limits`` checks each container's
framing and sizes before pyiceberg sees it; this checks every read inside the blocks.

:class:`BoundedDecoder` runs the compiled decoder over a copy of its bytes followed by zero bytes and checks each
read against the real end: a length-prefixed read before it copies anything, a float, a double or a boolean by
where it starts, a varint by where it starts too (of any length, it ends at its first byte below 0x80: at worst
the first zero), and ints read at once (no more than a tenth of the bytes left) by where they end, the zeros
being a tenth of the block's size. So reads never leave the copy: at worst the last varints of a block end in the
zeros, and the read is refused. A read past the end raises ``EOFError``, which planning reports as a manifest
that does not decode (``avro_limits.UNDECODABLE``).

``sqe.planning.pyiceberg_patches.install`` puts :func:`bounded_decoder` in place of
``pyiceberg.avro.file.new_decoder``, for the whole process: every Avro file pyiceberg reads in SQE's processes
(manifest lists and manifests, in the engine and in ``sqe-catalog``) was written by some table writer. pyiceberg's
pure-Python fallback reads through ``io.BytesIO`` and is bounded already. Either decoder knows its end
(:func:`unread_bytes`): Avro has no end marker, so a block stating fewer records than it holds is only told by
the bytes its records leave unread.
"""

from __future__ import annotations

import importlib.util
import struct
from array import array

from pyiceberg.avro.decoder import BinaryDecoder, StreamingBinaryDecoder

__all__ = ["BoundedDecoder", "MisstatedAvroError", "bounded_decoder", "unread_bytes"]

_MAX_VARINT_BYTES = 10
_FLOAT, _DOUBLE = struct.Struct("<f"), struct.Struct("<d")
_UNSIGNED = 2**64 - 1  # the compiled decoder's read_ints holds unsigned 64-bit ints: -1 is 2**64 - 1
_PADDING_BYTES = 16  # more than a varint started before the end can take past it
_COMPILED = importlib.util.find_spec("pyiceberg.avro.decoder_fast") is not None


class MisstatedAvroError(Exception):
    """An Avro file (or a manifest) whose stated counts disagree with what it holds: a block whose records leave
    bytes unread, a manifest whose entries are not those its manifest-list entry counts. Avro has no end
    marker: a file cut at a block boundary, or a block stating fewer records, decodes fewer records silently.
    Not a ValueError: planning reports it as a file that does not decode (``avro_limits.UNDECODABLE``)."""


def _padding(size: int) -> bytes:
    """The zeros after a block of ``size`` bytes: a varint has no length cap (it runs to its first byte below
    0x80), so ints read at once may run to the end in one and read the rest from the zeros, one byte each; at most
    a tenth of the block's bytes are read so (``read_ints``)."""
    return bytes(size // _MAX_VARINT_BYTES + _PADDING_BYTES)


def _past_the_end() -> EOFError:
    return EOFError("an Avro value runs past the end of its block")


class BoundedDecoder(BinaryDecoder):
    """pyiceberg's compiled decoder over ``data``, refusing any read past its end (see the module docstring).

    The hot methods are the compiled decoder's bound methods behind one position check each, written inline:
    decoding a manifest of 400 entries takes about 1.4 times as long as unchecked (a few ms), measured.
    """

    __slots__ = ("_decoder", "_end", "_read", "_read_int", "_tell")

    def __init__(self, data: bytes) -> None:
        from pyiceberg.avro.decoder_fast import CythonBinaryDecoder

        self._decoder = CythonBinaryDecoder(bytes(data) + _padding(len(data)))
        self._end = len(data)
        self._tell = self._decoder.tell
        self._read = self._decoder.read
        self._read_int = self._decoder.read_int

    def tell(self) -> int:
        return self._tell()

    def unread(self) -> int:
        """The bytes of the block after the position read to."""
        return self._end - self._tell()

    def _room(self, size: int) -> None:
        if size < 0 or self._tell() + size > self._end:
            raise _past_the_end()

    def _started(self) -> None:
        """A varint may start anywhere before the end (it ends at its first byte below 0x80; the zeros stop it)."""
        if self._tell() >= self._end:
            raise _past_the_end()

    def read(self, n: int) -> bytes:
        self._room(n)
        return self._read(n)

    def skip(self, n: int) -> None:
        self._room(n)
        self._decoder.skip(n)

    def read_boolean(self) -> bool:
        self._room(1)
        return self._decoder.read_boolean()

    def skip_boolean(self) -> None:
        self.skip(1)

    def read_float(self) -> float:
        return float(_FLOAT.unpack(self.read(4))[0])  # Avro's little-endian IEEE 754, as the compiled one reads

    def skip_float(self) -> None:
        self.skip(4)

    def read_double(self) -> float:
        return float(_DOUBLE.unpack(self.read(8))[0])

    def skip_double(self) -> None:
        self.skip(8)

    def read_int(self) -> int:
        if self._tell() >= self._end:  # inline, not _started(): the hottest read
            raise _past_the_end()
        return self._read_int()

    def skip_int(self) -> None:
        self._started()
        self._read_int()

    def read_ints(self, n: int) -> tuple[int, ...]:
        if n >= 0 and self._tell() + _MAX_VARINT_BYTES * n <= self._end:  # n is at most a tenth of the bytes
            ints = self._decoder.read_ints(n)  # the zeros after the block take what runs past it (see _padding)
            if self._tell() > self._end:
                raise _past_the_end()
            return ints
        # near the end: each checked (a count is a writer's), given as the compiled decoder gives them (unsigned)
        return array("Q", [self.read_int() & _UNSIGNED for _ in range(n)])  # type: ignore[return-value]

    def read_bytes(self) -> bytes:
        tell, end = self._tell, self._end
        if tell() >= end:
            raise _past_the_end()
        size = self._read_int()
        if size < 0 or tell() + size > end:
            raise _past_the_end()
        return self._read(size)

    def skip_bytes(self) -> None:
        self.skip(self.read_int())

    def read_utf8(self) -> str:
        return self.read_bytes().decode("utf-8")

    def skip_utf8(self) -> None:
        self.skip_bytes()

    def read_int_bytes_dict(self, n: int, dest: dict[int, bytes]) -> None:
        tell, end, read_int, read = self._tell, self._end, self._read_int, self._read
        for _ in range(n):  # a map of column ids to bounds: each length checked before its value is copied
            if tell() >= end:
                raise _past_the_end()
            key = read_int()
            if tell() >= end:
                raise _past_the_end()
            size = read_int()
            if size < 0 or tell() + size > end:
                raise _past_the_end()
            dest[key] = read(size)


class _SizedStreamingDecoder(StreamingBinaryDecoder):
    """pyiceberg's pure-Python decoder, knowing where its bytes end."""

    __slots__ = ("_end",)

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self._end = len(data)

    def unread(self) -> int:
        return self._end - self.tell()


def bounded_decoder(data: bytes) -> BinaryDecoder:
    """A decoder of ``data`` that never reads past its end: :class:`BoundedDecoder` over pyiceberg's compiled one,
    or where pyiceberg was built without it, its pure-Python one (which reads through ``io.BytesIO``)."""
    return BoundedDecoder(data) if _COMPILED else _SizedStreamingDecoder(data)


def unread_bytes(decoder: BinaryDecoder) -> int:
    """The bytes after ``decoder``'s position, for a decoder :func:`bounded_decoder` made (any other decoder is
    refused: its end is unknown, and a check that cannot run must not pass)."""
    if not isinstance(decoder, (BoundedDecoder, _SizedStreamingDecoder)):
        raise MisstatedAvroError("an Avro block was decoded by a decoder SQE did not make; its end is unknown")
    return decoder.unread()
