"""The C kernels of the column masks (``_masks.c``: the string masks and truncation's calendar pass), where
setup.py built them; ``masks`` is None otherwise and the Arrow kernels do the same work."""

from __future__ import annotations

try:  # a module import, not `from sqe.restrictions import`: that reads as an import of the package's __init__,
    # which imports its modules back (.ci/check_imports.py sees no .py file for _masks)
    import sqe.restrictions._masks as masks
except ImportError:  # no C compiler at install time
    masks = None  # type: ignore[assignment]

NATIVE = masks is not None

__all__ = ["NATIVE", "masks"]
