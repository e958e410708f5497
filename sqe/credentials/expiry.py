"""When a credential set stops being usable.

Credentials are used until 5 minutes before they expire; a token that had less than 10 minutes left when SQE
received it is used for half of what it had left (so a 2-minute token is not dead on arrival). A vended set
that names no expiry is *unknown*, not *forever*: it is used for ``max_age_seconds`` and then re-validated by
a reload. Static credentials never expire.
"""

from __future__ import annotations

import time
from typing import Literal

CredentialSource = Literal["vended", "static", "none"]

SAFETY_MARGIN_SECONDS = 300.0
SHORT_TOKEN_SECONDS = 600.0


def usable_until(
    expires_at_ms: int | None,
    received_at: float,
    *,
    source: CredentialSource = "vended",
    max_age_seconds: float = 900.0,
) -> float | None:
    """Epoch seconds after which these credentials must not be used; None for no limit (static/none)."""
    if source != "vended":
        return None
    if expires_at_ms is None:
        return received_at + max_age_seconds
    expires_at = expires_at_ms / 1000.0
    remaining = expires_at - received_at
    if remaining < SHORT_TOKEN_SECONDS:
        # Already-expired tokens land before received_at: unusable from the start (fail closed).
        return received_at + remaining / 2
    return expires_at - SAFETY_MARGIN_SECONDS


def is_expired(expires_at_ms: int | None, now: float | None = None) -> bool:
    """Whether a set naming this expiry is past it (a set without expiry is judged by ``usable_until``)."""
    return expires_at_ms is not None and (time.time() if now is None else now) >= expires_at_ms / 1000.0
