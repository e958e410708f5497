"""Scan planning (pyiceberg on SQE's FileIO) and the SQL analysis that feeds it.

``ReadSpec``, ``ScanPlan`` and ``plan_scan`` are loaded on first access: importing a pyiceberg-free submodule
(``statements``, ``views``, ``sql_analysis``) must not import pyiceberg's planner (start-up cost).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqe.planning.planner import ReadSpec, ScanPlan, plan_scan

__all__ = ["ReadSpec", "ScanPlan", "plan_scan"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("sqe.planning.planner"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
