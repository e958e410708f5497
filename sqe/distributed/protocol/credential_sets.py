"""The one check of the credential sets a message carries: a scan or rewrite ticket, or a credential push.

Both decode the same protobuf ``CredentialSet`` messages (``ticket.credentials_from_proto``) and then ask
:func:`credential_sets_problem`. Every set needs a prefix that is an S3 location and must be complete (the one
rule, ``CredentialSet.missing_parts``); no two sets may cover the same prefix (which one would win is
arbitrary). A push replaces keys a running fragment reads with, so its sets must also be vended (only those
are refreshed) and not yet expired. A problem is one line that names a prefix at most, never a key or token.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqe.credentials import CredentialSet, normalize_location

_PREFIX_SHOWN = 200  # a pushed prefix is shown escaped and cut to this many characters
_KEEPING = "; keeping the current keys"  # a refused push leaves the worker's keys as they were


def credential_sets_problem(sets: Sequence[CredentialSet], *, push: bool = False, now: float | None = None) -> str:
    """Why ``sets`` may not be used ("" when they may): the first problem found.

    ``push``: a credential push (vended, unexpired sets only; its refusal is logged as is, so prefixes are
    escaped and bounded, while a ticket's error is cut to one line where it is reported). ``now``: epoch seconds
    for the expiry check (the clock by default)."""
    seen: set[str] = set()
    for cred in sets:
        problem = _set_problem(cred, push, now)
        if problem:
            return problem
        key = normalize_location(cred.prefix or "").rstrip("/")
        if key in seen:
            return f"two credential sets for the prefix {_shown(cred.prefix or '', push)}{_keeping(push)}"
        seen.add(key)
    return ""


def _quoted_prefix(prefix: str) -> str:
    """A prefix as it may appear in a refusal and a log line: escaped (so one line) and bounded."""
    if prefix.isprintable() and len(prefix) <= _PREFIX_SHOWN:
        return prefix
    shown = repr(prefix[:_PREFIX_SHOWN])
    return shown if len(prefix) <= _PREFIX_SHOWN else shown + "..."


def _set_problem(cred: CredentialSet, push: bool, now: float | None) -> str:
    """The first problem of one set on its own ("" when none)."""
    if not cred.prefix:
        return "a credential set has no prefix"
    shown = _shown(cred.prefix, push)
    if not cred.covers_object_store():
        return f"the set for {shown} is not for an s3:// location" if push else _NOT_S3_IN_TICKET
    if push and cred.source != "vended":
        return f"the set for {shown} is not a vended set; only vended sets are refreshed"
    missing = cred.missing_parts()
    if missing:
        subject = f"the set for {shown}" if push else f"the {cred.source} credential set for {shown}"
        return f"{subject} is incomplete (missing {', '.join(missing)}){_keeping(push)}"
    if push and cred.is_expired(now):
        return f"the set for {shown} has already expired{_KEEPING}"
    return ""


# A ticket's refusal names no prefix here: its prefix is exactly what is wrong (a local path, another store).
_NOT_S3_IN_TICKET = "a credential set's prefix is not an s3:// location"


def _shown(prefix: str, push: bool) -> str:
    return _quoted_prefix(prefix) if push else prefix


def _keeping(push: bool) -> str:
    return _KEEPING if push else ""
