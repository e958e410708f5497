"""``keep_freed_memory``: a freed large block is reused instead of faulted in again, counted in page faults.

Each case runs in a fresh interpreter (the setting is process-wide and cannot be undone): it allocates and frees
a 48 MiB buffer (above glibc's largest adaptive mmap threshold, so by default every allocation is a fresh
mapping) ten times and reports the minor page faults of the last nine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sqe.execution.allocator import Tuning, keep_freed_memory

_PROBE = """
import json, resource, sys
from sqe.execution.allocator import keep_freed_memory
tuning = keep_freed_memory(int(sys.argv[1]))
block = bytearray(48 << 20)
del block
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(9):
    block = bytearray(48 << 20)  # zero-filled: every page is touched
    del block
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"tuning": tuning.value, "faults": faults}))
"""
PAGES_PER_BLOCK = (48 << 20) // os.sysconf("SC_PAGE_SIZE")
glibc_only = pytest.mark.skipif(
    not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"), reason="mallopt is glibc's (CI runs on Debian)"
)


def _probe(limit: int, **environ: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(limit)], env={**env, **environ}, capture_output=True, text=True, check=True
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


@glibc_only
def test_kept_memory_is_reused_instead_of_faulted_in_again() -> None:
    default, kept = _probe(0), _probe(1 << 30)
    assert (default["tuning"], kept["tuning"]) == (Tuning.OFF.value, Tuning.APPLIED.value)
    assert isinstance(default["faults"], int) and isinstance(kept["faults"], int)
    assert default["faults"] >= 8 * PAGES_PER_BLOCK  # each allocation mapped and faulted in afresh
    assert kept["faults"] < PAGES_PER_BLOCK // 4  # the freed block is reused


@glibc_only
def test_the_operators_malloc_environment_wins() -> None:
    chosen = _probe(1 << 30, MALLOC_TRIM_THRESHOLD_="131072", MALLOC_MMAP_THRESHOLD_="131072")
    assert chosen["tuning"] == Tuning.OPERATOR.value
    assert isinstance(chosen["faults"], int) and chosen["faults"] >= 8 * PAGES_PER_BLOCK


def test_what_counts_as_the_operators_choice() -> None:
    assert keep_freed_memory(1 << 30, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}) is Tuning.OPERATOR
    assert keep_freed_memory(1 << 30, {"MALLOC_MMAP_THRESHOLD_": "1"}) is Tuning.OPERATOR
    assert keep_freed_memory(0, {}) is Tuning.OFF
    with pytest.raises(ValueError, match="must not be negative"):
        keep_freed_memory(-1, {})
