"""Delegated catalog tokens: the engine, as a trusted reader, acting for one authenticated end user.

The catalog gives raw-data credentials of a table restricted for a user only to a token whose subject is that
user and whose actor is a trusted reader (``sqe-catalog``'s RFC 8693 extension: Polaris ignores
``actor_token``). :class:`DelegatedAuth` obtains the end user's token and the reader's token (each by client
credentials, or the end user's given token), exchanges them at ``/v1/oauth/tokens``, caches the delegated
token and exchanges again before it expires (a delegated token never outlives its subject token). Neither the
tokens nor the secrets appear in reprs or errors.
"""

from __future__ import annotations

import time

import requests

from sqe.catalog._auth import BearerAuth, Token, oauth_error, token_from_response
from sqe.errors import AuthenticationError, CatalogUnavailableError
from sqe.vocabulary import ACCESS_TOKEN_TYPE, TOKEN_EXCHANGE_GRANT


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

    def __repr__(self) -> str:
        who = f"end_user={self._end_user_name!r}, reader={self._reader_name!r}"
        return f"DelegatedAuth(token_url={self._token_url!r}, {who})"

    @property
    def uses_client_credentials(self) -> bool:
        return True  # the delegated token can always be exchanged anew

    def invalidate(self) -> None:
        """After a 401: forget the delegated token and both inputs, so the next call starts over."""
        self._end_user.invalidate()
        self._reader.invalidate()
        super().invalidate()

    def _fetch(self) -> Token:
        data = {
            "grant_type": TOKEN_EXCHANGE_GRANT,
            "subject_token": self._end_user.current_token(),
            "subject_token_type": ACCESS_TOKEN_TYPE,
            "actor_token": self._reader.current_token(),
            "actor_token_type": ACCESS_TOKEN_TYPE,
        }
        try:
            response = self._session.post(self._token_url, data=data)
        except requests.RequestException as exc:
            raise CatalogUnavailableError(
                f"cannot reach the catalog token endpoint {self._token_url}: {type(exc).__name__}"
            ) from None
        if response.status_code in (400, 401, 403):
            raise AuthenticationError(
                f"catalog refused to delegate {self._end_user_name!r} to reader {self._reader_name!r} "
                f"(HTTP {response.status_code}: {oauth_error(response)})",
                status=response.status_code,
            )
        if response.status_code != 200:
            raise CatalogUnavailableError(
                f"catalog token endpoint answered HTTP {response.status_code}", status=response.status_code
            )
        return token_from_response(response, time.time())
