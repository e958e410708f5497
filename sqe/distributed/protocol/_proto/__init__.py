"""Generated gRPC code for ``sqe.worker.v1`` (``proto/sqe/worker/v1/worker.proto``); never committed.

Two ways the modules ``worker_pb2`` / ``worker_pb2_grpc`` come to exist here:

* at build time: ``setup.py``'s ``build_py`` runs :func:`generate` before packaging (wheels, ``pip install .``);
* on first import in a source checkout (editable installs, tests): when the generated files are missing or older
  than the ``.proto``, this module regenerates them with ``grpc_tools`` (atomically, so concurrent imports are
  safe). An installed wheel has no ``.proto`` beside it and simply uses what the build generated.

The ``.proto`` is compiled under the virtual path ``sqe/distributed/protocol/_proto/worker.proto`` so the generated
gRPC module imports ``sqe.distributed.protocol._proto.worker_pb2`` (the proto package, and so the RPC names, stay
``sqe.worker.v1``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_PROTO = PACKAGE_DIR.parents[3] / "proto" / "sqe" / "worker" / "v1" / "worker.proto"
GENERATED_FILES = ("worker_pb2.py", "worker_pb2.pyi", "worker_pb2_grpc.py")
_VIRTUAL_DIR = "sqe/distributed/protocol/_proto"


def generate(proto: Path, package_dir: Path) -> None:
    """Compile ``proto`` into ``package_dir`` (``worker_pb2.py``, ``.pyi``, ``worker_pb2_grpc.py``)."""
    from grpc_tools import protoc  # build-time dependency (also a runtime one, for this fallback)

    with tempfile.TemporaryDirectory(prefix=".protoc-", dir=package_dir) as scratch:
        args = [
            "grpc_tools.protoc",
            f"-I{_VIRTUAL_DIR}={proto.parent}",
            f"--python_out={scratch}",
            f"--grpc_python_out={scratch}",
            f"--pyi_out={scratch}",
            str(proto),
        ]
        if protoc.main(args) != 0:
            raise ImportError(f"grpc_tools.protoc failed to compile {proto}")
        for name in GENERATED_FILES:
            # os.replace is atomic: a concurrent importer sees the old file or the new one, never half of one.
            os.replace(Path(scratch, _VIRTUAL_DIR, name), package_dir / name)
    shutil.rmtree(package_dir / "__pycache__", ignore_errors=True)


def _is_stale(proto: Path, package_dir: Path) -> bool:
    source_mtime = proto.stat().st_mtime
    for name in GENERATED_FILES:
        target = package_dir / name
        if not target.is_file() or target.stat().st_mtime < source_mtime:
            return True
    return False


def ensure_generated() -> None:
    """Regenerate from the source checkout's ``.proto`` when needed; no-op for an installed wheel."""
    if SOURCE_PROTO.is_file() and _is_stale(SOURCE_PROTO, PACKAGE_DIR):
        generate(SOURCE_PROTO, PACKAGE_DIR)


ensure_generated()
