"""Fragments: a scan's file tasks split into small groups balanced by bytes.

Tasks go largest first into the lightest fragment. Each worker runs a few fragments at a time and takes the
largest waiting one when a slot frees up (longest-processing-time-first list scheduling). Small fragments keep
a retry cheap (a retry re-reads its fragment, skipping the rows already forwarded).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyiceberg.table import FileScanTask


@dataclass(frozen=True)
class Fragment:
    index: int
    tasks: tuple[FileScanTask, ...] = field(repr=False)

    @property
    def nbytes(self) -> int:
        return sum(task.file.file_size_in_bytes for task in self.tasks)

    @property
    def records(self) -> int:
        """Rows of its data files: the most a worker can send for it (deletes and filters only drop rows)."""
        return sum(task.file.record_count for task in self.tasks)

    @property
    def files(self) -> int:
        return len(self.tasks)


def plan_fragments(tasks: Sequence[FileScanTask], *, slots: int, max_files: int, max_bytes: int) -> list[Fragment]:
    """Split tasks into fragments balanced by bytes (largest task first into the lightest fragment).

    There are enough fragments that none needs more than ``max_files`` files or ``max_bytes`` bytes on average,
    and at least one per slot (fragments the workers run at once) when there are enough files, so no slot idles
    while another reads several files in turn. Returned largest first.
    """
    if not tasks:
        return []
    total = sum(task.file.file_size_in_bytes for task in tasks)
    count = max(math.ceil(len(tasks) / max_files), math.ceil(total / max_bytes), min(slots, len(tasks)))
    count = min(count, len(tasks))
    bins: list[list[FileScanTask]] = [[] for _ in range(count)]
    loads = [0] * count
    for task in sorted(tasks, key=lambda t: (-t.file.file_size_in_bytes, t.file.file_path)):
        lightest = min(range(count), key=lambda i: (loads[i], len(bins[i]), i))
        bins[lightest].append(task)
        loads[lightest] += task.file.file_size_in_bytes
    ordered = sorted(range(count), key=lambda i: -loads[i])
    return [Fragment(n, tuple(bins[i])) for n, i in enumerate(ordered)]
