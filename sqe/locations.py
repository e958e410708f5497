"""What kind of storage a location names: the one rule behind every object-store or local decision of the engine,
the scan workers and ``sqe-catalog``.

A location's scheme is compared lower-cased, with Hadoop's ``s3a``/``s3n`` folded into ``s3`` (the schemes and
aliases themselves are :mod:`sqe.vocabulary`'s). Standard library and the vocabulary only, so the config layer can
use it; segment-boundary prefix matching (credential scoping) lives in :mod:`sqe.credentials.paths`.
"""

from __future__ import annotations

from sqe.vocabulary import LOCAL_SCHEMES, OBJECT_STORE_SCHEMES, SCHEME_ALIASES

__all__ = ["is_local", "is_object_store", "normalize_location", "scheme_of"]


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
