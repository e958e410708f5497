"""The catalog's refusal of a manifest list or manifest past the read limits (``sqe.planning.avro_limits``): a
422, since the table's own files are at fault and no retry changes that (a client can plan it itself, with
vended credentials)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sqe.planning.avro_limits import ManifestBounds
from sqe_catalog.errors import UnprocessableEntityError

__all__ = ["CatalogManifestBounds", "ManifestLimitError"]


class ManifestLimitError(UnprocessableEntityError):
    """A manifest list or manifest the catalog will not read: too large, or not an Avro container file."""


@dataclass(frozen=True)
class CatalogManifestBounds(ManifestBounds):
    """The shared limits, refused with the catalog's 422."""

    error: ClassVar[type[Exception]] = ManifestLimitError
