"""Structured audit lines for governed access: who got (or was refused) a restricted table, through which reader.

Every line goes to the ``sqe_catalog.audit`` logger at INFO as ``audit {JSON}`` (one object per line, keys
sorted). A governed response is any answer for a table on which the end user has read-restrictions::

    audit {"event":"governed-response","operation":"load","end_user":"alice","reader":"sqe-engine",
           "table":"wh.db.t","restriction_signature":"3f2a...","outcome":"served","status":200}

``reader`` is ``null`` for a caller using its own token. ``restriction_signature`` is a digest of the
restrictions served (never their content: no filter, value, mask or group appears). Names and outcomes only;
tokens, secrets and credentials never reach this module.
"""

from __future__ import annotations

import json
import logging

__all__ = ["governed_response", "token_exchanged"]

log = logging.getLogger("sqe_catalog.audit")

# A signature is a prefix of the restrictions digest: enough to tell versions apart, short enough to read.
_SIGNATURE_CHARS = 16


def _emit(event: str, **fields: object) -> None:
    log.info("audit %s", json.dumps({"event": event, **fields}, sort_keys=True, separators=(",", ":")))


def governed_response(
    *, operation: str, end_user: str, reader: str | None, table: str, digest: str, outcome: str, status: int
) -> None:
    """One line per response for a restricted table (served or refused)."""
    _emit(
        "governed-response",
        operation=operation,
        end_user=end_user,
        reader=reader,
        table=table,
        restriction_signature=digest[:_SIGNATURE_CHARS],
        outcome=outcome,
        status=status,
    )


def token_exchanged(end_user: str, reader: str, expires_in: int) -> None:
    """A delegated token was issued to ``reader`` for ``end_user``."""
    _emit("token-exchange", end_user=end_user, reader=reader, expires_in=expires_in)
