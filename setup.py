"""Build hooks: compile ``proto/`` (worker contract -> ``sqe/distributed/protocol/_proto``, Flight SQL messages ->
``sqe/server/_proto``) before packaging, and the C string masks (optional).

Everything else about the package is declared in ``pyproject.toml``. The generated modules are never committed;
the generator, ``sqe/_protogen.py``, also regenerates them on first import in a source checkout (editable installs).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from setuptools import Extension, setup  # type: ignore[import-untyped]
from setuptools.command.build_py import build_py  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent
GENERATOR = Path("sqe", "_protogen.py")


class BuildPyWithProto(build_py):  # type: ignore[misc]
    """``build_py`` that generates the gRPC modules first, so wheels (and editable builds) contain them."""

    def run(self) -> None:
        _load(ROOT / GENERATOR, "_sqe_protogen_build").generate_all()  # type: ignore[attr-defined]  # always fresh
        super().run()


def _load(path: Path, name: str) -> object:
    """Run the generator module by path (the package itself may not be importable yet); returns the module."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


# The string masks in C (sqe/restrictions/_masks.c). Optional: without a C compiler the build goes on and
# sqe/restrictions/string_masks.py runs the same masks with Arrow kernels (slower; `make test` checks it was built).
MASKS = Extension(
    "sqe.restrictions._masks",
    ["sqe/restrictions/_masks.c"],
    optional=True,
    extra_compile_args=[] if sys.platform == "win32" else ["-O3"],
)

setup(cmdclass={"build_py": BuildPyWithProto}, ext_modules=[MASKS])
