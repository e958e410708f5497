"""Distributed scans: the worker wire protocol (``protocol``) and the coordinator side (``coordinator``).

The scan worker service (the top-level ``workers`` package) and the coordinator both depend on ``protocol`` and on
the engine core; neither imports the other, and nothing under ``sqe`` imports ``workers``.
"""
