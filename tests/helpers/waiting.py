"""Waiting for something another thread or process does, asserting no time: poll with a generous deadline."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    """Return once ``condition()`` holds; fail naming ``what`` (what never happened) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)
