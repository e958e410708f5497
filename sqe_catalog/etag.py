"""Strong ETags for LoadTableResult / CommitTableResponse representations.

The tag digests everything that shapes the representation a caller receives: the metadata file, the snapshot
mode, whether credentials were vended and whether they can write, the read-restrictions digest, and the actor
of a delegated token (the reader), so a response for (user, reader A) never revalidates for (user, own token).
It never digests a credential, so a client holding a cached table can revalidate across credential renewals.
"""

from __future__ import annotations

import hashlib
import json

__all__ = ["governed_digest", "if_none_match_matches", "table_etag"]


def table_etag(
    metadata_location: str,
    *,
    snapshots: str,
    vended: bool,
    write: bool,
    restrictions_digest: str = "",
    actor: str = "",
) -> str:
    """A quoted strong ETag; differs whenever one of the inputs differs (``actor``: "" for a caller's own token)."""
    fields = [metadata_location, snapshots, "vended" if vended else "plain", "write" if write else "read"]
    fields.append(restrictions_digest)
    if actor:
        fields.append(f"actor:{actor}")  # appended only when set, so own-token ETags stay as they were
    digest = hashlib.sha256(json.dumps(fields, separators=(",", ":")).encode("utf-8")).hexdigest()
    return f'"{digest}"'


# -- governed responses (sqe_catalog.policies) ------------------------------------------------------------


def governed_digest(
    *,
    end_user: str,
    identity_revision: str,
    governance_revision: int,
    schema_id: int,
    signature: str,
    capability: str,
) -> str:
    """The restrictions digest of a governed response (``table_etag``'s ``restrictions_digest``).

    With the metadata location, snapshot mode and reader that ``table_etag`` adds, a governed ETag covers
    everything the design lists: metadata, end user and identity revision (its groups), policy and tag revision,
    schema, canonical restriction signature, capability version and trusted-reader identity.
    """
    fields = [end_user, identity_revision, str(governance_revision), str(schema_id), signature, capability]
    return hashlib.sha256(json.dumps(fields, separators=(",", ":")).encode("utf-8")).hexdigest()


# -- end governed responses -------------------------------------------------------------------------------


def if_none_match_matches(header: str | None, etag: str) -> bool:
    """RFC 9110 If-None-Match (weak comparison): ``*`` or any listed tag equal to ``etag``."""
    if not header:
        return False
    for candidate in header.split(","):
        tag = candidate.strip()
        if tag == "*":
            return True
        if tag.removeprefix("W/") == etag:
            return True
    return False
