"""Build hook: compile ``proto/`` (worker contract -> ``sqe/distributed/protocol/_proto``, Flight SQL messages ->
``sqe/server/_proto``) before packaging.

Everything else about the package is declared in ``pyproject.toml``. The generated modules are never committed;
``sqe/distributed/protocol/_proto/__init__.py`` also regenerates them on first import in a source checkout
(editable installs).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from setuptools import setup  # type: ignore[import-untyped]
from setuptools.command.build_py import build_py  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent
GENERATOR = Path("sqe", "distributed", "protocol", "_proto", "__init__.py")


class BuildPyWithProto(build_py):  # type: ignore[misc]
    """``build_py`` that generates the gRPC modules first, so wheels (and editable builds) contain them."""

    def run(self) -> None:
        worker = _load(ROOT / GENERATOR, "_sqe_proto_build")
        worker.generate(worker.SOURCE_PROTO, worker.PACKAGE_DIR)  # type: ignore[attr-defined]  # always fresh
        _load(ROOT / "sqe" / "server" / "_proto" / "__init__.py", "_sqe_flight_sql_proto_build").generate()  # type: ignore[attr-defined]
        super().run()


def _load(path: Path, name: str) -> object:
    """Run a generator module by path (the package itself may not be importable yet); returns the module."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # regenerates when missing or stale
    return module


setup(cmdclass={"build_py": BuildPyWithProto})
