"""Compiles the ``.proto`` files under ``proto/`` into the packages that hold their generated code (never committed).

One generator for both: the worker contract (``sqe.distributed.protocol._proto``) and the Flight SQL messages of
``sqe serve`` (``sqe.server._proto``). Each of those packages names its sources in a :class:`ProtoSet` and calls
:meth:`ProtoSet.ensure_generated` on import, which in a source checkout regenerates the modules when they are
missing, older than their ``.proto`` or made by a generator newer than this environment's grpcio or protobuf
(atomically, so concurrent imports are safe); an installed wheel has no ``proto/`` beside it and uses what the
build generated. ``setup.py``'s ``build_py`` loads this file by path (the package may not be importable yet) and
calls :func:`generate_all` before packaging.

Standard library only at import time: ``grpc_tools`` is imported when something is compiled.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# What the generated modules say about the generator that made them (the runtime must be at least that).
_PROTOBUF_GENCODE = re.compile(r"^# Protobuf Python Version: (\S+)$", re.MULTILINE)
_GRPC_GENCODE = re.compile(r"^GRPC_GENERATED_VERSION = '([^']+)'$", re.MULTILINE)
_SQE_DIR = Path(__file__).resolve().parent
_PROTO_ROOT = _SQE_DIR.parent / "proto"  # present in a source checkout only


@dataclass(frozen=True)
class ProtoSet:
    """The ``.proto`` sources of one generated package, by module stem (``worker`` -> ``worker_pb2.py``)."""

    package: str  # dotted, e.g. "sqe.server._proto": the generated code imports its siblings under this name
    sources: Mapping[str, Path]
    grpc: bool = False  # also generate ``<stem>_pb2_grpc.py`` (service stubs)

    @property
    def package_dir(self) -> Path:
        return _SQE_DIR.parent.joinpath(*self.package.split("."))

    def outputs(self, stem: str) -> tuple[str, ...]:
        suffixes = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py") if self.grpc else ("_pb2.py", "_pb2.pyi")
        return tuple(stem + suffix for suffix in suffixes)

    def generate(self) -> None:
        """Compile every source into :attr:`package_dir`, replacing each generated file atomically."""
        from grpc_tools import protoc  # build-time dependency (also a runtime one, for the checkout fallback)

        # The virtual include path makes the generated code import ``<package>.<stem>_pb2``.
        virtual_dir = self.package.replace(".", "/")
        for stem, proto in self.sources.items():
            with tempfile.TemporaryDirectory(prefix=".protoc-", dir=self.package_dir) as scratch:
                args = [
                    "grpc_tools.protoc",
                    f"-I{virtual_dir}={proto.parent}",
                    f"--python_out={scratch}",
                    f"--pyi_out={scratch}",
                    *([f"--grpc_python_out={scratch}"] if self.grpc else []),
                    str(proto),
                ]
                if protoc.main(args) != 0:
                    raise ImportError(f"grpc_tools.protoc failed to compile {proto}")
                for name in self.outputs(stem):
                    # os.replace is atomic: a concurrent importer sees the old file or the new one, never half.
                    os.replace(Path(scratch, virtual_dir, name), self.package_dir / name)
        shutil.rmtree(self.package_dir / "__pycache__", ignore_errors=True)

    def is_stale(self) -> bool:
        """True when a generated module is missing, older than its ``.proto``, or made by a generator newer than
        this environment's protobuf or grpcio runtime (which would refuse to import it)."""
        for stem, proto in self.sources.items():
            source_mtime = proto.stat().st_mtime
            for name in self.outputs(stem):
                target = self.package_dir / name
                if not target.is_file() or target.stat().st_mtime < source_mtime:
                    return True
            if self._needs_a_newer_runtime(stem):
                return True
        return False

    def _needs_a_newer_runtime(self, stem: str) -> bool:
        """A refreshed editable install compiles in pip's isolated build environment, whose grpcio-tools may be
        newer than the grpcio and protobuf this environment keeps; its code then fails on import. Regenerated with
        this environment's own grpcio-tools (which requires at least its grpcio and protobuf), it imports."""
        checks = [(f"{stem}_pb2.py", _PROTOBUF_GENCODE, "google.protobuf")]
        if self.grpc:
            checks.append((f"{stem}_pb2_grpc.py", _GRPC_GENCODE, "grpc"))
        for name, pattern, runtime in checks:
            match = pattern.search(_head(self.package_dir / name))
            if match is not None and release_of(match.group(1)) > release_of(_runtime_version(runtime)):
                return True
        return False

    def ensure_generated(self) -> None:
        """Regenerate from the source checkout's ``.proto`` files when needed; no-op for an installed wheel."""
        if all(proto.is_file() for proto in self.sources.values()) and self.is_stale():
            self.generate()


def _head(path: Path, size: int = 4096) -> str:
    """The start of a generated module, where its generator versions stand ("" when it cannot be read)."""
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            return fh.read(size)
    except OSError:
        return ""


def release_of(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version string ("1.85.4rc1" -> (1, 85, 4); () when there is none)."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def _runtime_version(module: str) -> str:
    """``module.__version__``: the figure the generated code itself checks. The generated module imports the
    runtime next anyway; a missing one reads as "" (regenerating then fails, naming it)."""
    import importlib  # only once a generated package is imported

    try:
        return str(getattr(importlib.import_module(module), "__version__", ""))
    except ImportError:
        return ""


WORKER = ProtoSet(
    "sqe.distributed.protocol._proto",
    {"worker": _PROTO_ROOT / "sqe" / "worker" / "v1" / "worker.proto"},
    grpc=True,
)
_FLIGHT = _PROTO_ROOT / "arrow" / "flight" / "protocol"
FLIGHT_SQL = ProtoSet(
    "sqe.server._proto",
    {"flight_sql": _FLIGHT / "sql" / "flight_sql.proto", "flight_cancel": _FLIGHT / "flight_cancel.proto"},
)


def generate_all() -> None:
    """Build time: compile every generated package afresh."""
    for proto_set in (WORKER, FLIGHT_SQL):
        proto_set.generate()
