"""Hypothesis profile for the fuzz tests: bounded, reproducible, no example database.

``derandomize`` makes every run draw the same examples (CI reproducible) and ``database=None`` keeps the
runs free of state left by earlier runs. ``SQE_FUZZ_EXAMPLES`` raises the bound for a longer local run.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, settings

settings.register_profile(
    "sqe-fuzz",
    derandomize=True,
    database=None,
    max_examples=int(os.environ.get("SQE_FUZZ_EXAMPLES", "60")),
    deadline=2000,  # ms per example: a parser that takes longer than this on a tiny input is a hang
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=True,
)
# Local triage: generate only (no shrinking), to see a failure fast.
settings.register_profile("sqe-fuzz-triage", parent=settings.get_profile("sqe-fuzz"), phases=[Phase.generate])
settings.load_profile(os.environ.get("SQE_FUZZ_PROFILE", "sqe-fuzz"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A hang is a defect too: every fuzz test fails after a minute instead of waiting for the global timeout."""
    for item in items:
        if "tests/fuzz/" in item.nodeid.replace("\\", "/") or item.nodeid.startswith("fuzz/"):
            item.add_marker(pytest.mark.timeout(60))
