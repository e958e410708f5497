"""OAuth2 client-credentials tokens for catalog requests, refreshed before they expire.

A token's lifetime is counted from when its request was sent, not when the answer arrived: the catalog stamps
whole seconds, so counting from the answer would let SQE think a token lives longer than the catalog does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import Any

import requests

from sqe._text import MAX_MESSAGE_CHARS, first_line, redact_credentials, without_secrets
from sqe._unpicklable import Unpicklable
from sqe.errors import AuthenticationError, CatalogProtocolError, CatalogUnavailableError

# Refresh when less than this share of the token's lifetime (or 60 s, whichever is smaller) remains.
_REFRESH_SHARE = 0.2
_REFRESH_MAX_MARGIN = 60.0


@dataclass
class Token:
    value: str = field(repr=False)
    expires_at: float | None
    refresh_at: float | None
    issued_at: float | None = None

    def is_due(self, now: float) -> bool:
        """Past its refresh point (a token without a lifetime, e.g. a given one, is never due)."""
        return self.refresh_at is not None and now >= self.refresh_at

    def remaining_share(self, now: float) -> float:
        """The share of its lifetime still ahead (1.0 for a token without a lifetime)."""
        if self.expires_at is None or self.issued_at is None or self.expires_at <= self.issued_at:
            return 1.0
        return max(0.0, (self.expires_at - now) / (self.expires_at - self.issued_at))


# repr=False: the hand-written __repr__ leaves the secret out; eq=False: equal settings are not the same session.
@dataclass(repr=False, eq=False)
class BearerAuth(Unpicklable, requests.auth.AuthBase):
    """Adds ``Authorization: Bearer`` to requests; fetches and refreshes client-credentials tokens."""

    session: requests.Session
    token_url: str
    _: KW_ONLY
    client_id: str = ""
    client_secret: str = ""
    scope: str = "PRINCIPAL_ROLE:ALL"
    static_token: InitVar[str] = ""  # a fixed token instead of client credentials; kept only as ``_token``
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _token: Token | None = field(default=None, init=False)
    _fetches: int = field(default=0, init=False)  # tokens fetched so far (see ``fetches``)

    _pickle_refusal = "catalog credentials cannot be pickled"

    def __post_init__(self, static_token: str) -> None:
        if static_token:
            self._token = Token(static_token, None, None)

    def __repr__(self) -> str:
        return f"BearerAuth(token_url={redact_credentials(repr(self.token_url))}, client_id={self.client_id!r})"

    @property
    def uses_client_credentials(self) -> bool:
        return bool(self.client_id)

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = f"Bearer {self.current_token()}"
        return request

    def current_token(self) -> str:
        return self.token_with_share(0.0)

    def token_with_share(self, keep_share: float) -> str:
        """The token, fetched anew when it is due or (if this auth can fetch one) when less than ``keep_share``
        of its lifetime remains: a token exchanged for a delegated one caps that token's lifetime."""
        with self._lock:
            token, now = self._token, time.time()
            if (
                token is None
                or token.is_due(now)
                or (self.uses_client_credentials and token.remaining_share(now) < keep_share)
            ):
                token = self._token = self._fetch()
                self._fetches += 1
            return token.value

    @property
    def fetches(self) -> int:
        """How many tokens this auth has fetched: one that changed across a call fetched its token for that call.
        A count, not a time: a token answered without ``expires_in`` has no issue time, and the wall clock may be
        set back meanwhile."""
        return self._fetches

    def invalidate(self) -> None:
        """Forget the current token (after a 401) so the next request fetches a new one."""
        if self.uses_client_credentials:
            with self._lock:
                self._token = None

    def _fetch(self) -> Token:
        if not self.client_id:
            raise AuthenticationError("no catalog credentials configured (catalog.client_id or catalog.token)")
        data = client_credentials_form(self.client_id, self.client_secret, self.scope)
        sent_at = time.time()
        response = post_token_request(self.session, self.token_url, data)
        if response.status_code in (400, 401, 403):
            raise AuthenticationError(
                f"catalog rejected client {self.client_id!r} at {self.token_url} "
                f"(HTTP {response.status_code}: {oauth_error(response, self.client_secret)})",
                status=response.status_code,
            )
        require_ok(response)
        return token_from_response(response, sent_at)


def client_credentials_form(client_id: str, client_secret: str, scope: str) -> dict[str, str]:
    """The token request form of the OAuth 2.0 ``client_credentials`` grant."""
    return {"grant_type": "client_credentials", "client_id": client_id, "client_secret": client_secret, "scope": scope}


def post_token_request(session: requests.Session, token_url: str, data: dict[str, str]) -> requests.Response:
    """POST a form to the token endpoint; an unreachable endpoint -> CatalogUnavailableError (no form values).

    A redirect is answered, never followed: requests resends a form to the host a 307 or 308 names, and the form
    holds the client secret (or an exchange's tokens). A browser or curl sends no credential to another origin."""
    try:
        return session.post(token_url, data=data, allow_redirects=False)
    except requests.RequestException as exc:
        raise CatalogUnavailableError(
            f"cannot reach the catalog token endpoint {token_url}: {type(exc).__name__}"
        ) from None


def require_ok(response: requests.Response) -> None:
    """Any status but 200 left after the OAuth refusals is the catalog failing, not the caller."""
    if response.status_code != 200:
        redirect = ", a redirect (not followed with credentials)" if response.is_redirect else ""
        raise CatalogUnavailableError(
            f"catalog token endpoint answered HTTP {response.status_code}{redirect}", status=response.status_code
        )


def token_from_response(response: requests.Response, now: float) -> Token:
    """The token of a 200 OAuth token response, with its refresh point counted from ``now`` (when the request
    was sent); malformed -> CatalogProtocolError."""
    try:
        body = response.json()
        value = str(body["access_token"])
        expires_in = expires_in_of(body)
    except (ValueError, KeyError, TypeError):
        raise CatalogProtocolError("catalog token response is not a valid OAuth token response") from None
    if expires_in is not None:
        return Token(value, now + expires_in, refresh_point(now, expires_in), now)
    return Token(value, None, None)


def expires_in_of(body: Mapping[str, Any]) -> float | None:
    """A token response's ``expires_in`` when it is a positive number of seconds, else None."""
    expires_in = body.get("expires_in")
    if isinstance(expires_in, int | float) and not isinstance(expires_in, bool) and expires_in > 0:
        return expires_in
    return None


def refresh_point(now: float, expires_in: float) -> float:
    """When to fetch anew a token issued at ``now`` for ``expires_in`` seconds (see ``_REFRESH_SHARE``)."""
    return now + expires_in - min(_REFRESH_MAX_MARGIN, expires_in * _REFRESH_SHARE)


def oauth_error_code(response: requests.Response) -> str:
    """The RFC 6749 ``error`` code of an OAuth refusal ("" when the body has none)."""
    try:
        body = response.json()
    except ValueError:
        return ""
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, str) else ""


def oauth_error(response: requests.Response, *sent: str, fallback: str = "no details", limit: int | None = None) -> str:
    """The refusal's description (OAuth ``error`` or ErrorModel ``message``; ``fallback`` when it has none) as one
    line of at most ``limit`` characters, with any of the ``sent`` secrets or tokens, or a long piece of one (a
    quote cut short), blanked out."""
    try:
        body = response.json()
    except ValueError:
        body = None
    text = fallback
    if isinstance(body, dict):
        if isinstance(body.get("error"), str):
            text = str(body.get("error_description") or body["error"])
        elif isinstance(body.get("error"), dict):
            text = str(body["error"].get("message") or fallback)
    # Text past what any message shows goes first: the search for pieces of a secret reads every character.
    return first_line(without_secrets(text[:MAX_MESSAGE_CHARS], sent), limit=limit)
