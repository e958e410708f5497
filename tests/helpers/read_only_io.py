"""A table's FileIO wrapped for planning tests: reads pass through ``new_input`` (which a test overrides to
record, hold back or refuse them); writes and deletes are refused."""

from __future__ import annotations

from pyiceberg.io import FileIO, InputFile, OutputFile


class ReadOnlyIO(FileIO):
    def __init__(self, inner: FileIO) -> None:
        super().__init__(properties={})
        self._inner = inner

    def new_input(self, location: str) -> InputFile:
        return self._inner.new_input(location)

    def new_output(self, location: str) -> OutputFile:
        raise OSError("read only")

    def delete(self, location: str | InputFile | OutputFile) -> None:
        raise OSError("read only")
