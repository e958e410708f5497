"""What the scan benchmarks share: the synthetic table they write and the moto stack they run it on.

Imported by the scripts beside it (``python bench/<script>.py`` puts this folder first on ``sys.path``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

TAGS = pa.array([f"tag-{i:03d}" for i in range(100)])


def chunk(start: int, rows: int) -> pa.Table:
    """Rows ``start .. start+rows-1``: id, x (0..999 random), y (random double), tag (100 distinct strings)."""
    x = pc.cast(pc.floor(pc.multiply(pc.random(rows), 1000)), pa.int64())
    tag_index = pc.cast(pc.floor(pc.multiply(pc.random(rows), len(TAGS))), pa.int32())
    return pa.table(
        {
            "id": pa.array(range(start, start + rows), pa.int64()),
            "x": x,
            "y": pc.random(rows),
            "tag": TAGS.take(tag_index),
        }
    )


@contextmanager
def store_stack(root: Path, store: str = "moto") -> Iterator[Any]:
    """The embedded stack under ``root/stack``, stopped on exit: on moto, or with ``store="ceph"`` on Ceph RGW
    (a real object store, whose ranged GETs cost by the range, where moto's read the whole object)."""
    from sqe_stack import apply_client_env, start_stack, stop_stack

    apply_client_env(store)  # before this process's first pyarrow S3 filesystem (the writer's)
    started = time.perf_counter()
    info = start_stack(root / "stack", store=store)
    print(f"{store}: stack up in {time.perf_counter() - started:.1f} s", flush=True)
    try:
        yield info
    finally:
        stop_stack(root / "stack")
