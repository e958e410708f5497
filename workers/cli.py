"""``sqe-worker``: placeholder until distributed scans land."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("sqe-worker: distributed scan workers are not yet available in this version", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
