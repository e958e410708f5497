"""OAuth 2.0 token exchange (RFC 8693) at ``POST /v1/oauth/tokens``: a reader acting for an end user.

This is **our extension** of the Polaris dialect: Polaris accepts the token-exchange grant but ignores
``actor_token``; sqe-catalog requires it, because the actor is what makes a response for a restricted table
safe to give (only a trusted reader enforces read-restrictions). The request (form-encoded)::

    grant_type=urn:ietf:params:oauth:grant-type:token-exchange
    subject_token=<the end user's access token>   subject_token_type=urn:ietf:params:oauth:token-type:access_token
    actor_token=<the reader's access token>       actor_token_type=urn:ietf:params:oauth:token-type:access_token
    scope=PRINCIPAL_ROLE:...                        (optional: narrows the subject token's roles)

Both tokens must be issued by this catalog (its signing key), unexpired, and bound to their principals' current
secrets. The answer is a delegated access token: subject = the end user (grants and restrictions use it), actor =
the reader (``act`` claim; trust uses it), expiring no later than the subject token. Failures, in the order they
are checked, with RFC 6749 section 5.2 error JSON:

=====================================================================  ======================  ======
request                                                                ``error``               status
=====================================================================  ======================  ======
a field missing, a ``*_token_type`` other than access_token            ``invalid_request``     400
``resource`` or ``audience`` (no other targets exist)                  ``invalid_target``      400
actor token invalid, expired, foreign or revoked                       ``invalid_client``      401
actor token itself delegated, or its principal not a reader            ``unauthorized_client`` 400
subject token invalid, expired, foreign, revoked, delegated or a reader ``invalid_grant``       400
scope malformed, wider than the subject token's, or a role not held    ``invalid_scope``       400
=====================================================================  ======================  ======

A delegated token is re-checked on every call (``AuthStore.principal_for_token``): deleting or rotating either
principal revokes it (401), and revoking the end user's grants or the actor's reader status takes effect on
the next request (403).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sqe.vocabulary import ACCESS_TOKEN_TYPE
from sqe_catalog.audit import token_exchanged
from sqe_catalog.auth import AuthStore, VerifiedToken, parse_scope
from sqe_catalog.errors import BadRequestError, NotAuthorizedError

__all__ = ["DelegatedToken", "TokenExchangeError", "exchange_token"]


class TokenExchangeError(Exception):
    """An OAuth error answer: ``error`` code, a one-line description (never a token) and the HTTP status."""

    def __init__(self, error: str, description: str, status: int = 400) -> None:
        super().__init__(description)
        self.error, self.description, self.status = error, description, status


@dataclass(frozen=True)
class DelegatedToken:
    """The token issued by an exchange; the repr leaves the token itself out (it is a secret)."""

    access_token: str = field(repr=False)
    expires_in: int


def exchange_token(auth: AuthStore, form: Mapping[str, str]) -> DelegatedToken:
    """Check one token-exchange request and mint its delegated token; raises TokenExchangeError."""
    subject_token = _required_token(form, "subject_token")
    actor_token = _required_token(form, "actor_token")
    _refuse_targets(form)
    actor = _verified_actor(auth, actor_token)
    subject = _verified_subject(auth, subject_token, actor)
    roles = _delegated_roles(auth, subject, form.get("scope"))
    try:
        token, expires_in = auth.issue_delegated_token(subject, actor, roles)
    except NotAuthorizedError:
        raise TokenExchangeError("invalid_grant", "the subject token expired") from None
    token_exchanged(subject.name, actor.name, expires_in)
    return DelegatedToken(token, expires_in)


def _required_token(form: Mapping[str, str], name: str) -> str:
    value = form.get(name, "").strip()
    if not value:
        why = " (sqe-catalog delegates only to a reader)" if name == "actor_token" else ""
        raise TokenExchangeError("invalid_request", f"{name} is required{why}")
    kind = form.get(f"{name}_type", "")
    if kind != ACCESS_TOKEN_TYPE:
        raise TokenExchangeError("invalid_request", f"{name}_type must be {ACCESS_TOKEN_TYPE}")
    return value


def _refuse_targets(form: Mapping[str, str]) -> None:
    if form.get("resource") or form.get("audience"):
        raise TokenExchangeError("invalid_target", "resource and audience are not supported: the catalog is the target")
    requested = form.get("requested_token_type")
    if requested and requested != ACCESS_TOKEN_TYPE:
        raise TokenExchangeError("invalid_request", f"requested_token_type must be {ACCESS_TOKEN_TYPE}")


def _verified_actor(auth: AuthStore, token: str) -> VerifiedToken:
    try:
        actor = auth.verify_token(token)
    except NotAuthorizedError as exc:
        raise TokenExchangeError("invalid_client", f"actor_token rejected: {exc.message}", 401) from None
    if actor.is_delegated:
        raise TokenExchangeError("unauthorized_client", "a delegated token cannot be an actor_token")
    if not actor.is_reader:
        raise TokenExchangeError("unauthorized_client", f"principal {actor.name} is not a reader")
    return actor


def _verified_subject(auth: AuthStore, token: str, actor: VerifiedToken) -> VerifiedToken:
    try:
        subject = auth.verify_token(token)
    except NotAuthorizedError as exc:
        raise TokenExchangeError("invalid_grant", f"subject_token rejected: {exc.message}") from None
    if subject.is_delegated:
        raise TokenExchangeError("invalid_grant", "a delegated token cannot be exchanged again")
    if subject.is_reader or subject.name == actor.name:
        raise TokenExchangeError("invalid_grant", "the subject must be an end user, not a reader")
    return subject


def _delegated_roles(auth: AuthStore, subject: VerifiedToken, scope: str | None) -> frozenset[str] | None:
    """The subject token's roles, narrowed by ``scope`` when given; never wider, and only roles the subject holds
    now (as ``client_credentials`` requires: a token for all roles does not make a role named in a scope held)."""
    if not scope:
        return subject.roles
    try:
        requested = parse_scope(scope)
        if requested is None:
            return subject.roles
        if subject.roles is not None and not requested <= subject.roles:
            extra = sorted(requested - subject.roles)[0]
            raise TokenExchangeError("invalid_scope", f"role {extra} is not active in the subject token")
        auth.require_roles_held(subject.name, requested)
    except BadRequestError as exc:
        raise TokenExchangeError("invalid_scope", exc.message.removeprefix("invalid_scope: ")) from None
    return requested
