"""Typed errors of the policy layer: every one carries a stable ``code`` (and, for source errors, a position).

Codes are part of the contract (conformance fixtures assert them); messages are for people. A message never
contains a literal value of a policy, only names an administrator wrote (columns, groups, actions) and only
where the error goes to an administrator: the load path replaces it with a generic one (``GovernedLoadError``).
"""

from __future__ import annotations

from sqe._text import redacted_message

__all__ = ["PolicyError", "RegoError"]


class PolicyError(Exception):
    """A policy, tag or binding problem with a stable machine-readable code."""

    def __init__(self, code: str, message: str) -> None:
        message = redacted_message(message)  # as every catalog error: a name quoting a URL keeps no password
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message


class RegoError(PolicyError):
    """A restricted-Rego source problem found at save time; ``position`` is a 0-based character offset."""

    def __init__(self, code: str, message: str, position: int) -> None:
        super().__init__(code, f"{message} at position {position}")
        self.position = position
