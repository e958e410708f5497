"""The shared text and network helpers and counters."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from sqe._counters import Counters
from sqe._net import is_loopback
from sqe._text import first_line, iso_utc


def test_first_line_cuts_multiline_and_names_empty_exceptions() -> None:
    assert first_line(ValueError("  one\ntwo ")) == "one"
    assert first_line(ValueError()) == "ValueError"
    assert first_line("") == ""
    assert first_line("abcdef", limit=3) == "abc"


def test_is_loopback_accepts_only_this_machine() -> None:
    assert all(is_loopback(host) for host in ("localhost", "127.0.0.1", "127.8.9.10", "::1"))
    assert not any(is_loopback(host) for host in ("0.0.0.0", "10.0.0.1", "::", "example.internal", ""))


def test_iso_utc() -> None:
    assert iso_utc(0) == "1970-01-01T00:00:00+00:00"
    assert iso_utc(86_400.9, zulu=True) == "1970-01-02T00:00:00Z"  # Java Instant's form, to the second
    assert iso_utc(None) is None


@dataclass
class _Stats(Counters):
    done: int = 0
    peak: int = 0
    _hidden: int = 0


def test_counters_are_atomic_and_snapshots_hide_private_fields() -> None:
    stats = _Stats()

    def bump() -> None:
        for _ in range(1000):
            stats.add(done=1)

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats.raise_to("peak", 5)
    stats.raise_to("peak", 3)
    assert stats.snapshot() == {"done": 4000, "peak": 5}
