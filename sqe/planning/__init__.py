"""Scan planning (pyiceberg on SQE's FileIO) and the SQL analysis that feeds it."""

from sqe.planning.planner import ReadSpec, ScanPlan, plan_scan

__all__ = ["ReadSpec", "ScanPlan", "plan_scan"]
