"""OAuth2 client-credentials tokens for catalog requests, refreshed before they expire."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import NoReturn

import requests

from sqe.errors import AuthenticationError, CatalogProtocolError, CatalogUnavailableError

# Refresh when less than this share of the token's lifetime (or 60 s, whichever is smaller) remains.
_REFRESH_SHARE = 0.2
_REFRESH_MAX_MARGIN = 60.0


@dataclass
class Token:
    value: str = field(repr=False)
    expires_at: float | None
    refresh_at: float | None


class BearerAuth(requests.auth.AuthBase):
    """Adds ``Authorization: Bearer`` to requests; fetches and refreshes client-credentials tokens."""

    def __init__(
        self,
        session: requests.Session,
        token_url: str,
        *,
        client_id: str = "",
        client_secret: str = "",
        scope: str = "PRINCIPAL_ROLE:ALL",
        static_token: str = "",
    ) -> None:
        self._session = session
        self._token_url = token_url
        self._client_id = client_id
        self._client_secret = client_secret
        self._scope = scope
        self._lock = threading.Lock()
        self._token: Token | None = Token(static_token, None, None) if static_token else None

    def __repr__(self) -> str:
        return f"BearerAuth(token_url={self._token_url!r}, client_id={self._client_id!r})"

    def __reduce__(self) -> NoReturn:
        raise TypeError("catalog credentials cannot be pickled")

    @property
    def uses_client_credentials(self) -> bool:
        return bool(self._client_id)

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = f"Bearer {self.current_token()}"
        return request

    def current_token(self) -> str:
        with self._lock:
            token = self._token
            if token is None or (token.refresh_at is not None and time.time() >= token.refresh_at):
                token = self._token = self._fetch()
            return token.value

    def invalidate(self) -> None:
        """Forget the current token (after a 401) so the next request fetches a new one."""
        if self.uses_client_credentials:
            with self._lock:
                self._token = None

    def _fetch(self) -> Token:
        if not self._client_id:
            raise AuthenticationError("no catalog credentials configured (catalog.client_id or catalog.token)")
        data = {
            "grant_type": "client_credentials",
            "client_id": self._client_id,
            "client_secret": self._client_secret,
            "scope": self._scope,
        }
        try:
            response = self._session.post(self._token_url, data=data)
        except requests.RequestException as exc:
            raise CatalogUnavailableError(
                f"cannot reach the catalog token endpoint {self._token_url}: {type(exc).__name__}"
            ) from None
        if response.status_code in (400, 401, 403):
            raise AuthenticationError(
                f"catalog rejected client {self._client_id!r} at {self._token_url} "
                f"(HTTP {response.status_code}: {oauth_error(response)})",
                status=response.status_code,
            )
        if response.status_code != 200:
            raise CatalogUnavailableError(
                f"catalog token endpoint answered HTTP {response.status_code}", status=response.status_code
            )
        return token_from_response(response, time.time())


def token_from_response(response: requests.Response, now: float) -> Token:
    """The token of a 200 OAuth token response, with its refresh point; malformed -> CatalogProtocolError."""
    try:
        body = response.json()
        value = str(body["access_token"])
        expires_in = body.get("expires_in")
    except (ValueError, KeyError, TypeError):
        raise CatalogProtocolError("catalog token response is not a valid OAuth token response") from None
    if isinstance(expires_in, int | float) and not isinstance(expires_in, bool) and expires_in > 0:
        margin = min(_REFRESH_MAX_MARGIN, expires_in * _REFRESH_SHARE)
        return Token(value, now + expires_in, now + expires_in - margin)
    return Token(value, None, None)


def oauth_error(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return "no details"
    if isinstance(body, dict):
        if isinstance(body.get("error"), str):
            return str(body.get("error_description") or body["error"])
        if isinstance(body.get("error"), dict):
            return str(body["error"].get("message", "no details"))
    return "no details"
