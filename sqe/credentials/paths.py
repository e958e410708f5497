"""Locations for credential scoping: prefix matching on segment boundaries, whatever the scheme spelling
(:func:`sqe.locations.normalize_location` decides that)."""

from __future__ import annotations

from collections.abc import Iterable

from sqe.locations import normalize_location


def _strip_prefix(prefix: str) -> str:
    normalized = normalize_location(prefix)
    stripped = normalized.rstrip("/")
    # "s3://" alone (or "file:///") must keep its separator, or it would stop matching anything.
    return normalized if stripped.endswith(":") or stripped.endswith(":/") else stripped


def has_dot_segment(location: str) -> bool:
    """Whether ``location`` has a ``.`` or ``..`` path segment.

    The AWS SDK (pyarrow's S3 client) and urllib3 resolve those before sending, so ``s3://b/t1/../t2/x`` reads
    ``s3://b/t2/x``: matched as text, it would get ``s3://b/t1``'s credentials for another prefix's object.
    """
    _, _, rest = location.partition("://")
    return any(segment in (".", "..") for segment in rest.split("/"))


def prefix_matches(path: str, prefix: str) -> bool:
    """True when ``prefix`` covers ``path`` on a path-segment boundary.

    ``s3://b/t1`` covers ``s3://b/t1`` and ``s3://b/t1/x`` but not ``s3://b/t10/x`` (a raw ``startswith``
    would hand one table's credentials to its neighbour's files). A path with a ``.`` or ``..`` segment is
    covered by no prefix (:func:`has_dot_segment`).
    """
    if not prefix or has_dot_segment(path):
        return False
    base = _strip_prefix(prefix)
    target = normalize_location(path)
    if base.endswith("/"):  # a scheme-only prefix such as "s3://"
        return target.startswith(base)
    return target == base or target.startswith(base + "/")


def covered_by_any(path: str, prefixes: Iterable[str]) -> bool:
    """True when one of ``prefixes`` covers ``path`` (``prefix_matches``)."""
    return any(prefix_matches(path, prefix) for prefix in prefixes)


def canonical_prefix(prefix: str) -> str:
    """``prefix`` as matching sees it: ``s3a://b/t/`` and ``s3://b/t`` are the same prefix."""
    return _strip_prefix(prefix)


def prefix_length(prefix: str) -> int:
    """Length used to rank matches: longest (most specific) wins, whatever the scheme spelling."""
    return len(_strip_prefix(prefix))
