"""Locations for credential scoping: scheme normalisation and prefix matching on segment boundaries."""

from __future__ import annotations

from sqe.vocabulary import LOCAL_SCHEMES, OBJECT_STORE_SCHEMES, SCHEME_ALIASES


def scheme_of(location: str) -> str:
    """Lower-case scheme of ``location``; "" for a bare local path."""
    head, sep, _ = location.partition("://")
    return head.lower() if sep else ""


def normalize_location(location: str) -> str:
    """``s3a://`` and ``s3n://`` (Hadoop's names for the same objects) become ``s3://``; the scheme is
    lower-cased; the rest is left alone."""
    head, sep, rest = location.partition("://")
    if not sep:
        return location
    scheme = head.lower()
    return f"{SCHEME_ALIASES.get(scheme, scheme)}://{rest}"


def is_object_store(location: str) -> bool:
    return scheme_of(location) in OBJECT_STORE_SCHEMES


def is_local(location: str) -> bool:
    return scheme_of(location) in LOCAL_SCHEMES


def _strip_prefix(prefix: str) -> str:
    normalized = normalize_location(prefix)
    stripped = normalized.rstrip("/")
    # "s3://" alone (or "file:///") must keep its separator, or it would stop matching anything.
    return normalized if stripped.endswith(":") or stripped.endswith(":/") else stripped


def prefix_matches(path: str, prefix: str) -> bool:
    """True when ``prefix`` covers ``path`` on a path-segment boundary.

    ``s3://b/t1`` covers ``s3://b/t1`` and ``s3://b/t1/x`` but not ``s3://b/t10/x`` (a raw ``startswith``
    would hand one table's credentials to its neighbour's files).
    """
    if not prefix:
        return False
    base = _strip_prefix(prefix)
    target = normalize_location(path)
    if base.endswith("/"):  # a scheme-only prefix such as "s3://"
        return target.startswith(base)
    return target == base or target.startswith(base + "/")


def prefix_length(prefix: str) -> int:
    """Length used to rank matches: longest (most specific) wins, whatever the scheme spelling."""
    return len(_strip_prefix(prefix))
