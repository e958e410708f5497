"""Keeping freed memory for reuse, so a scan's large buffers are not faulted in page by page again and again.

glibc's ``malloc`` serves a block above its mmap threshold (128 KiB at start, raised as blocks are freed, at most
32 MiB) with fresh pages from the kernel, unmapped again on ``free``, and gives free memory at the top of the heap
back once more than its trim threshold lies there. A scan allocates and frees buffers of many MiB all the time
(decoded batches, a worker's IPC messages, the Python bytes of a file range), so every such buffer is faulted in
and zeroed by the kernel page by page again. Measured on this project's 2-core machine: copying a 37 MB Arrow IPC
body into fresh pages took 27 ms, into reused ones 6 ms; a pinned scan worker's rows/s rose 1.15-1.2x,
an in-process ``select *`` of 4M rows ran 1.3-1.5x faster.

:func:`keep_freed_memory` raises both thresholds with ``mallopt(3)`` (blocks up to ``min(limit, 256 MiB)`` come
from the heap, and up to ``limit`` bytes of free memory are kept at the top of each heap), for the whole process.
The cost is that the process's resident size stays near its peak instead of falling back. ``limit`` is per malloc
arena, not per process: glibc gives threads several arenas (up to 8 per core), each keeping up to ``limit``, so
the process can keep several times ``limit`` of freed memory (never more than its peak use).
It changes nothing when ``limit`` is 0, when the C library is not glibc, or when the operator already set
``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or a ``glibc.malloc`` tunable in ``GLIBC_TUNABLES``: their
choice wins. glibc keeps no way to return to its adaptive defaults, so a later ``limit`` of 0 leaves an earlier
setting in place.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import enum
import functools
import os
import threading
from collections.abc import Callable, Mapping
from typing import cast

# Larger blocks are still mapped on their own: rare, and a fault per page is cheap next to their use.
_MAX_HEAP_BLOCK = 256 << 20
_OLD_GLIBC_MAX_THRESHOLD = 32 << 20
_M_TRIM_THRESHOLD = -1  # <malloc.h>
_M_MMAP_THRESHOLD = -3
_OPERATOR_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_lock = threading.Lock()


class Tuning(enum.Enum):
    """What :func:`keep_freed_memory` did."""

    APPLIED = "applied"
    OFF = "off"
    OPERATOR = "left to the MALLOC_* environment"
    UNSUPPORTED = "not glibc, left alone"


def keep_freed_memory(limit: int, environ: Mapping[str, str] | None = None) -> Tuning:
    """Keep up to ``limit`` bytes of freed memory for reuse per malloc arena of this process (see the module
    docstring)."""
    if limit < 0:
        raise ValueError("the amount of freed memory to keep must not be negative")
    if limit == 0:
        return Tuning.OFF
    if _operator_chose(os.environ if environ is None else environ):
        return Tuning.OPERATOR
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return Tuning.UNSUPPORTED
    with _lock:
        # glibc before 2.35 refuses an mmap threshold above 32 MiB (its adaptive maximum): then take that
        mapped = mallopt(_M_MMAP_THRESHOLD, min(limit, _MAX_HEAP_BLOCK)) or mallopt(
            _M_MMAP_THRESHOLD, min(limit, _OLD_GLIBC_MAX_THRESHOLD)
        )
        trimmed = mallopt(_M_TRIM_THRESHOLD, min(limit, 2**31 - 1))
    return Tuning.APPLIED if mapped == 1 and trimmed == 1 else Tuning.UNSUPPORTED


def _operator_chose(environ: Mapping[str, str]) -> bool:
    if any(name in environ for name in _OPERATOR_VARIABLES):
        return True
    return "glibc.malloc." in environ.get("GLIBC_TUNABLES", "")


@functools.cache
def _glibc_mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``, or None (another C library, or none found)."""
    if not _glibc_version().startswith("glibc"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        function = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int)
    function.restype = ctypes.c_int
    return cast("Callable[[int, int], int]", function)


def _glibc_version() -> str:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):  # not a name this system knows: not glibc
        return ""
