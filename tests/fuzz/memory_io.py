"""Files held in memory, for fuzz cases that read one mutated file through pyiceberg's FileIO interface."""

from __future__ import annotations

from pyiceberg.io import FileIO, InputFile, OutputFile

from sqe.execution.delete_limits import _CheckedFile as BytesFile  # an InputFile over bytes (exists, opens them)

__all__ = ["BytesFile", "BytesIO"]


class BytesIO(FileIO):
    """Every path reads ``data``; nothing is written."""

    def __init__(self, data: bytes) -> None:
        super().__init__({})
        self._data = data

    def new_input(self, location: str) -> InputFile:
        return BytesFile(location, self._data)

    def new_output(self, location: str) -> OutputFile:
        raise NotImplementedError

    def delete(self, location: str | InputFile | OutputFile) -> None:
        raise NotImplementedError
