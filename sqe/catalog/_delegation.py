"""Delegated catalog tokens: the engine, as a trusted reader, acting for one authenticated end user.

The catalog gives raw-data credentials of a table restricted for a user only to a token whose subject is that
user and whose actor is a trusted reader (``sqe-catalog``'s RFC 8693 extension: Polaris ignores
``actor_token``). :class:`DelegatedAuth` obtains the end user's token and the reader's token (each by client
credentials, or the end user's given token), exchanges them at ``/v1/oauth/tokens``, caches the delegated
token and exchanges again before it expires. Neither the tokens nor the secrets appear in reprs or errors.

A delegated token never outlives its subject token, so exchanging again with an old subject token only yields
an ever shorter delegated token: a re-exchange first fetches a new subject token when less than half of the
current one's lifetime remains. A subject or actor token that expired on the catalog's clock before ours
(``invalid_grant`` / ``invalid_client``) is fetched anew and the exchange tried once more; one fetched for this
very exchange is refused for another reason (a subject that may not be delegated, a reader that is none), so it
is not: a retry would cost the catalog a login and an exchange for the same answer. Any other refusal is an
:class:`AuthenticationError` naming the end user and the reader, never a token or secret.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import requests

from sqe._text import redact_credentials
from sqe.catalog._auth import (
    BearerAuth,
    Token,
    oauth_error,
    oauth_error_code,
    post_token_request,
    require_ok,
    token_from_response,
)
from sqe.errors import AuthenticationError
from sqe.vocabulary import ACCESS_TOKEN_TYPE, TOKEN_EXCHANGE_GRANT

if TYPE_CHECKING:
    from sqe.config import CatalogConnection

# Re-exchange with a fresh subject token once less than this share of the subject token's lifetime remains.
_SUBJECT_KEEP_SHARE = 0.5
# RFC 6749 error codes the catalog answers for a stale input token (see sqe_catalog.delegation's table).
_STALE_SUBJECT = "invalid_grant"
_STALE_ACTOR = "invalid_client"


class DelegatedAuth(BearerAuth):
    """``Authorization: Bearer <delegated token>`` for (end user, reader); re-exchanged before expiry."""

    def __init__(
        self,
        session: requests.Session,
        token_url: str,
        *,
        end_user: BearerAuth,
        reader: BearerAuth,
        end_user_name: str,
        reader_name: str,
    ) -> None:
        super().__init__(session, token_url)
        self._end_user = end_user
        self._reader = reader
        self._end_user_name = end_user_name
        self._reader_name = reader_name
        self.exchanges = 0  # successful exchanges so far (a count only, for observability)

    def __repr__(self) -> str:
        who = f"end_user={self._end_user_name!r}, reader={self._reader_name!r}"
        return f"DelegatedAuth(token_url={redact_credentials(repr(self.token_url))}, {who})"

    @property
    def uses_client_credentials(self) -> bool:
        return True  # the delegated token can always be exchanged anew

    def invalidate(self) -> None:
        """After a 401: forget the delegated token and both inputs, so the next call starts over."""
        self._end_user.invalidate()
        self._reader.invalidate()
        super().invalidate()

    def _fetch(self) -> Token:
        before = {self._end_user: self._end_user.fetches, self._reader: self._reader.fetches}
        subject, actor = self._input_tokens()
        sent_at = time.time()
        response = self._exchange(subject, actor)
        stale = self._refreshable_input(response, before)
        if stale is not None:
            stale.invalidate()  # expired on the catalog's clock before ours: fetch it anew, exchange once more
            subject, actor = self._input_tokens()
            sent_at = time.time()
            response = self._exchange(subject, actor)
        if response.status_code in (400, 401, 403):
            raise AuthenticationError(
                f"catalog refused to delegate end user {self._end_user_name!r} to reader {self._reader_name!r} "
                f"(HTTP {response.status_code} {oauth_error_code(response) or 'error'}: "
                f"{oauth_error(response, subject, actor)})",
                status=response.status_code,
            )
        require_ok(response)
        token = token_from_response(response, sent_at)
        self.exchanges += 1
        return token

    def _input_tokens(self) -> tuple[str, str]:
        """(subject, actor): the end user's token with enough lifetime left, and the reader's token."""
        return self._end_user.token_with_share(_SUBJECT_KEEP_SHARE), self._reader.current_token()

    def _refreshable_input(self, response: requests.Response, before: dict[BearerAuth, int]) -> BearerAuth | None:
        """The input a refusal calls stale, when it can be fetched anew (a given token cannot) and was not fetched
        for this exchange (its ``fetches`` moved from ``before``): a token just issued is not stale."""
        if response.status_code not in (400, 401):
            return None
        code = oauth_error_code(response)
        stale = {_STALE_SUBJECT: self._end_user, _STALE_ACTOR: self._reader}.get(code or "")
        if stale is None or not stale.uses_client_credentials or stale.fetches != before[stale]:
            return None
        return stale

    def _exchange(self, subject: str, actor: str) -> requests.Response:
        return post_token_request(self.session, self.token_url, token_exchange_form(subject, actor))


def token_exchange_form(subject_token: str, actor_token: str) -> dict[str, str]:
    """The RFC 8693 token exchange form: ``subject_token`` delegated to the actor (a trusted reader)."""
    return {
        "grant_type": TOKEN_EXCHANGE_GRANT,
        "subject_token": subject_token,
        "subject_token_type": ACCESS_TOKEN_TYPE,
        "actor_token": actor_token,
        "actor_token_type": ACCESS_TOKEN_TYPE,
    }


# Every role of the reader principal (it needs none for data; a role-narrowed scope would be refused). The user's
# scope never applies to the reader: it names the user's roles, which the reader does not hold.
READER_SCOPE = "PRINCIPAL_ROLE:ALL"


def catalog_auth(session: requests.Session, endpoint: CatalogConnection) -> BearerAuth:
    """The end user's own token, or (with a reader configured) a token delegated by the user to the reader."""
    token_url = endpoint.uri.rstrip("/") + "/v1/oauth/tokens"
    end_user = BearerAuth(
        session,
        token_url,
        client_id=endpoint.client_id or "",
        client_secret=endpoint.client_secret_value() or "",
        scope=endpoint.scope,
        static_token=endpoint.token_value() or "",
    )
    if not endpoint.delegates:
        return end_user
    reader = BearerAuth(
        session,
        token_url,
        client_id=endpoint.reader_client_id or "",
        client_secret=endpoint.reader_client_secret_value() or "",
        # The reader holds no data roles: the user's scope narrows the user's token, never the reader's.
        scope=READER_SCOPE,
    )
    return DelegatedAuth(
        session,
        token_url,
        end_user=end_user,
        reader=reader,
        end_user_name=endpoint.client_id or "token user",
        reader_name=endpoint.reader_client_id or "",
    )
