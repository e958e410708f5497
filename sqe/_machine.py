"""What of the machine a process may take: its memory (a control group's limit when less than the machine's), and
the bounds every DuckDB database limit (``sqe.duckdb_connection.DatabaseLimits``) is checked against. Shared by
``sqe serve`` (each engine's limits) and ``sqe-worker`` (each partial aggregation's), so both read a container's
limit alike. Standard library only: configuration checks import it without DuckDB."""

from __future__ import annotations

import os
from pathlib import Path

MIN_DATABASE_MEMORY_BYTES = 16 << 20  # DuckDB's own structures take a few MiB before any row
# Past these DuckDB fails a database's opening (a byte count past 64 bits: a parse error), or hangs in it
# (100000 threads) or aborts the whole process (2**63 - 1 threads: C++'s length_error): a typo must stop the start.
MAX_DATABASE_BYTES = 2**63 - 1
MAX_DATABASE_THREADS = 1024
MACHINE_SHARE = 0.5  # of the memory, and of the spill disk's free space, that a process's databases share by default

CGROUP_ROOT = Path("/sys/fs/cgroup")  # where cgroup v2 is mounted, and v1's memory controller under memory/


def memory_share(parts: int) -> int:
    """One of ``parts`` databases' share of half the memory (or of the control group's limit), at least 16 MiB."""
    return max(MIN_DATABASE_MEMORY_BYTES, int(physical_memory_bytes() * MACHINE_SHARE) // parts)


def spill_share(free_bytes: int, parts: int) -> int:
    """One of ``parts`` databases' share of half the spill disk's ``free_bytes``."""
    return int(free_bytes * MACHINE_SHARE) // parts


def physical_memory_bytes() -> int:
    """The machine's memory, or the memory limit of the process's control group (a container's, a systemd
    unit's ``MemoryMax``) when that is less."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        membership = Path("/proc/self/cgroup").read_text(encoding="ascii", errors="replace")
    except OSError:
        membership = ""
    limit = cgroup_memory_limit(membership, CGROUP_ROOT)
    return memory if limit is None else min(memory, limit)


def cgroup_memory_limit(membership: str, root: Path) -> int | None:
    """The least memory limit of the control group ``membership`` (``/proc/self/cgroup``'s text) names and of its
    ancestors: cgroup v2's ``memory.max``, v1's ``memory.limit_in_bytes``. Not only the hierarchy's root, which is
    the process's own group only in a container with a cgroup namespace (or its group mounted there): a systemd
    unit's limit, or a parent group's, is on the way up from the process's group. None when no limit is readable
    (``max``, no such file, not Linux); whatever cannot be read is passed over."""
    places = [(root, "memory.max", ""), (root / "memory", "memory.limit_in_bytes", "")]
    for line in membership.splitlines():
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if controllers == "":  # cgroup v2
            places.append((root, "memory.max", path))
        elif "memory" in controllers.split(","):
            places.append((root / "memory", "memory.limit_in_bytes", path))
    limits = [
        limit
        for mount, name, path in places
        for group in _group_and_ancestors(mount, path)
        if (limit := _limit_in(group / name)) is not None
    ]
    return min(limits, default=None)


def _group_and_ancestors(mount: Path, path: str) -> list[Path]:
    """``mount/path`` and each directory above it up to ``mount``. A group outside the process's cgroup namespace
    shows as ``/../..``: then only ``mount`` itself, never a directory outside it."""
    parts = [part for part in path.split("/") if part]
    if any(part in (".", "..") for part in parts):
        parts = []
    return [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _limit_in(file: Path) -> int | None:
    try:
        text = file.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2): no limit; v1's "no limit" is a huge number
