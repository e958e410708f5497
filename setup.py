"""Build hook: compile ``proto/sqe/worker/v1/worker.proto`` into ``sqe/distributed/protocol/_proto`` before
packaging.

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
        spec = importlib.util.spec_from_file_location("_sqe_proto_build", ROOT / GENERATOR)
        if spec is None or spec.loader is None:
            raise RuntimeError(f"cannot load {GENERATOR}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # regenerates when missing or stale
        module.generate(module.SOURCE_PROTO, module.PACKAGE_DIR)  # always fresh in a build
        super().run()


setup(cmdclass={"build_py": BuildPyWithProto})
