"""Cost of matching one listed path against a file table function glob, in µs per path.

Run: .venv/bin/python bench/glob_match.py [--paths N] [--ref REV]

A listing of a large prefix tests every key against the glob, so this cost is paid per listed file. The script
loads ``sqe/execution/tvf.py`` as it is at ``--ref`` (default: c2d73ef, the last commit with the bit-parallel
automaton) beside the working tree's, and prints the µs per path of each for typical and adversarial patterns
(``re`` took exponential time on the adversarial ones), with a plain ``re`` translation for scale. Both
matchers must stay fast on every row; the two need not agree on every path (``**`` changed meaning since
c2d73ef).
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from sqe.execution import tvf

ROOT = Path(__file__).resolve().parent.parent

TYPICAL = (
    "bucket/exports/*.parquet",
    "bucket/exports/**/*.parquet",
    "bucket/exports/date=2024-0[1-6]-*/part-*.snappy.parquet",
    "bucket/exports/date=*/hour=[!0]?/*.parquet",
)
# They end as the listed keys do, so no literal prefix or suffix test rejects a key before the matcher runs.
ADVERSARIAL = (
    "bucket/exports/" + "**?" * 7 + "**.parquet",
    "bucket/exports/" + "*?" * 30 + ".parquet",
    "bucket/" + "**a" * 40 + "**.parquet",
    "bucket/exports/" + "*a" * 20 + "*.parquet",
    "bucket/" + "**/" * 12 + "*.parquet",
)


def _paths(count: int) -> list[str]:
    rng = random.Random(7)
    paths = []
    for i in range(count):
        day = f"date=2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}/hour={rng.randint(0, 23):02d}"
        name = f"part-{i:05d}-{rng.getrandbits(128):032x}-c000.snappy.parquet"
        paths.append(f"bucket/exports/{day}/{name}" if i % 4 else f"bucket/exports/{name}")
    paths.append("bucket/" + "a" * 1000)  # one long key, as the adversarial patterns are meant to meet
    return paths


def _reference(rev: str) -> ModuleType:
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:sqe/execution/tvf.py"], check=True, capture_output=True, text=True
    ).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as handle:
        handle.write(source)
    spec = importlib.util.spec_from_file_location("tvf_reference", handle.name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tvf_reference"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _plain_re(pattern: str) -> Callable[[str], object]:
    """A naive translation (``*`` to ``[^/]*``, ``**`` to ``.*``): fast on typical patterns only."""
    parts = re.split(r"(\*\*|\*|\?)", pattern)
    table = {"**": ".*", "*": "[^/]*", "?": "[^/]"}
    return re.compile("".join(table.get(p, re.escape(p)) for p in parts), re.DOTALL).fullmatch


def _time(match: Callable[[str], object], paths: list[str], budget: float) -> float:
    """µs per path: whole passes over ``paths`` until ``budget`` seconds have passed (at least one)."""
    started = time.perf_counter()
    passes = 0
    while True:
        for path in paths:
            match(path)
        passes += 1
        elapsed = time.perf_counter() - started
        if elapsed >= budget:
            return elapsed / (passes * len(paths)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paths", type=int, default=2000)
    parser.add_argument("--ref", default="c2d73ef")
    parser.add_argument("--budget", type=float, default=0.5, help="seconds per measurement")
    args = parser.parse_args()
    paths = _paths(args.paths)
    reference = _reference(args.ref)
    print(f"{len(paths)} paths; µs per path ({args.ref} / working tree / plain re, adversarial re skipped)")
    for kind, patterns in (("typical", TYPICAL), ("adversarial", ADVERSARIAL)):
        for pattern in patterns:
            old = _time(reference.compile_glob(pattern).match, paths, args.budget)
            new = _time(tvf.compile_glob(pattern).match, paths, args.budget)
            plain = f"{_time(_plain_re(pattern), paths, args.budget):7.2f}" if kind == "typical" else "      -"
            shown = pattern if len(pattern) <= 56 else pattern[:53] + "..."
            print(f"{kind:11}  {shown:56}  {old:8.2f}  {new:7.2f}  {plain}")


if __name__ == "__main__":
    main()
