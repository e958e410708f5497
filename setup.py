"""Build hook: compile ``proto/`` (worker contract -> ``workers/_proto``, Flight SQL messages -> ``sqe/server/_proto``).

Everything else about the package is declared in ``pyproject.toml``. The generated modules are never committed;
``workers/_proto/__init__.py`` also regenerates them on first import in a source checkout (editable installs).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from setuptools import setup  # type: ignore[import-untyped]
from setuptools.command.build_py import build_py  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent


class BuildPyWithProto(build_py):  # type: ignore[misc]
    """``build_py`` that generates the gRPC modules first, so wheels (and editable builds) contain them."""

    def run(self) -> None:
        spec = importlib.util.spec_from_file_location("_sqe_proto_build", ROOT / "workers" / "_proto" / "__init__.py")
        if spec is None or spec.loader is None:
            raise RuntimeError("cannot load workers/_proto/__init__.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # regenerates when missing or stale
        module.generate(module.SOURCE_PROTO, module.PACKAGE_DIR)  # always fresh in a build
        _load(ROOT / "sqe" / "server" / "_proto" / "__init__.py", "_sqe_flight_sql_proto_build").generate()
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
