"""Who is calling, and which catalog token their engine session uses: the server's ``IdentityBroker``.

Every Flight call carries the end user's catalog credentials: a bearer token the catalog issued to them, or HTTP
Basic with their catalog client id and secret (exchanged here for a token by ``client_credentials``, which the same
credentials get again while it is fresh; the secret is never stored). :meth:`IdentityBroker.authenticate` checks
the token **at the catalog** on every call (``GET /v1/config``; ``auth_cache_seconds`` may cache a success
briefly), so an expired, revoked or foreign token is refused on the very next call.

Delegation (RFC 8693, the trusted-readers issue): with ``reader_client_id`` configured, the server holds a reader
identity; it obtains its own reader token by ``client_credentials`` and exchanges, per user, ``subject_token`` =
the user's token and ``actor_token`` = the reader token for a delegated token, cached per user and re-exchanged
before it expires. User sessions load tables with the delegated token, so the catalog applies the user's grants
and restrictions and trusts the reader. Without a reader identity the user's own token is used directly, which
only serves tables that carry no restrictions for that user once the catalog requires a trusted reader.

Nothing here ever puts a token or secret into a message, a log line or a repr.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import secrets
import threading
import time
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import requests

from sqe._text import redact_credentials, short_identity
from sqe._unpicklable import Unpicklable
from sqe.catalog._auth import client_credentials_form, expires_in_of, oauth_error, oauth_error_code, refresh_point
from sqe.catalog._delegation import READER_SCOPE, token_exchange_form
from sqe.errors import AuthenticationError, CatalogProtocolError, CatalogUnavailableError

log = logging.getLogger(__name__)


@dataclass(frozen=True, repr=False)
class User(Unpicklable):
    """An authenticated end user. ``key`` names them for sessions and limits (shown shortened); ``token`` and
    ``authority`` are never shown.

    ``authority`` names what this token lets them do (:func:`authority_of`): two tokens of one principal with
    other role scopes differ in it, so a client session made under one is never used under the other.
    """

    key: str
    token: str = field(repr=False)
    issued_token: bool = False  # True when the server obtained the token from Basic credentials
    authority: str = field(repr=False, kw_only=True)  # no default: every user is made with its own

    _pickle_refusal = "users carry a token and cannot be pickled"

    def __repr__(self) -> str:
        return f"User(key={short_identity(self.key)!r}, issued_token={self.issued_token!r})"


@dataclass
class _Cached:
    value: str = field(repr=False)
    refresh_at: float


def fingerprint(token: str) -> str:
    """A short non-reversible tag for a token, for display only (logs, reprs). Never a key: two tokens share
    one of 64 bits after some 2**32 tokens, so whatever is keyed by it would be shared between them."""
    return identity_digest(token)[:16]


def identity_digest(text: str) -> str:
    """The non-reversible digest anything that tells users, tokens or authorities apart is keyed by (user keys,
    engine reuse, mount store names): the whole SHA-256, so no two of them ever share state by a collision."""
    return hashlib.sha256(text.encode()).hexdigest()


# Claims that only say when a token was issued or which issue it is: tokens differing in these alone carry the
# same authority (a refreshed token keeps its client session). Every other claim (roles, scope, actor, audience,
# the principal's secret generation, and any claim unknown here) must match.
_ISSUANCE_CLAIMS = frozenset({"iat", "exp", "nbf", "jti", "auth_time"})


def _claims_of(token: str) -> dict[str, Any] | None:
    """The claims of a JWT-like token (``payload.signature`` or ``header.payload.signature``), read only after the
    catalog accepted the token; None for an opaque one."""
    payload = token.split(".")[0] if "." in token else ""
    if token.count(".") == 2:  # a JWT: header.payload.signature
        payload = token.split(".")[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, binascii.Error):
        return None
    return claims if isinstance(claims, dict) else None


def _subject_of(token: str) -> str | None:
    """The ``sub`` claim of a JWT-like token, read only after the catalog accepted the token."""
    sub = (_claims_of(token) or {}).get("sub")
    return sub if isinstance(sub, str) and sub else None


def authority_of(token: str) -> str:
    """A digest of what ``token`` authorizes: its claims but the issuance ones, or the whole token when it is
    opaque (the catalog alone knows its scope). Full SHA-256: one token's state must never serve another's."""
    claims = _claims_of(token)
    if claims is None:
        return hashlib.sha256(f"token\0{token}".encode()).hexdigest()
    kept = {name: value for name, value in claims.items() if name not in _ISSUANCE_CLAIMS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def _lifetime(body: dict[str, Any], now: float) -> float:
    """When to re-exchange (or re-fetch) a token answered with ``expires_in``, by the catalog client's rule (an
    hour on when absent)."""
    expires_in = expires_in_of(body)
    return now + 3600.0 if expires_in is None else refresh_point(now, expires_in)


# repr=False: the hand-written __repr__ leaves the secret out; eq=False: a broker is a service, not a value.
@dataclass(repr=False, eq=False)
class IdentityBroker(Unpicklable):
    """Authenticates end users at the catalog and hands out the catalog token each user's session uses."""

    catalog_uri: str
    warehouse: str
    _: KW_ONLY
    scope: str = "PRINCIPAL_ROLE:ALL"  # of users' Basic logins only; the reader always asks for all its roles
    reader_client_id: str | None = None
    reader_client_secret: str | None = None
    timeout: float = 30.0
    auth_cache_seconds: float = 0.0
    _http: requests.Session = field(default_factory=requests.Session, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _reader_token: _Cached | None = field(default=None, init=False)
    # One reader login at a time: calls needing a new reader token together share one (see ``_reader``).
    _reader_login: threading.Lock = field(default_factory=threading.Lock, init=False)
    # keyed digest of the user's token (``_token_key``) -> delegated token
    _delegated: dict[str, _Cached] = field(default_factory=dict, init=False)
    # keyed digest of the user's token -> accepted until
    _checked: dict[str, float] = field(default_factory=dict, init=False)
    # keyed digest of Basic credentials -> the token they were exchanged for (never the secret itself)
    _basic: dict[str, _Cached] = field(default_factory=dict, init=False)
    # Keys every cache lookup above; dies with the process.
    _cache_secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), init=False)

    _pickle_refusal = "the identity broker holds the reader secret and cannot be pickled"

    def __post_init__(self) -> None:
        self.catalog_uri = self.catalog_uri.rstrip("/")

    def __repr__(self) -> str:
        return f"IdentityBroker(uri={redact_credentials(repr(self.catalog_uri))}, reader={self.reader_client_id!r})"

    @property
    def token_url(self) -> str:
        return f"{self.catalog_uri}/v1/oauth/tokens"

    @property
    def delegates(self) -> bool:
        return self.reader_client_id is not None

    # -- authentication ---------------------------------------------------------------------------------

    def authenticate_bearer(self, token: str) -> User:
        """The user behind ``token``, checked at the catalog now (or within ``auth_cache_seconds``)."""
        if not token:
            raise AuthenticationError("empty bearer token")
        key = self._token_key(token)
        now = time.monotonic()
        with self._lock:
            accepted_until = self._checked.get(key, 0.0)
        if now >= accepted_until:
            self._check_at_catalog(token)
            if self.auth_cache_seconds > 0:
                with self._lock:
                    self._checked[key] = now + self.auth_cache_seconds
                    self._forget_unchecked(now)
        return self._user(token)

    def authenticate_basic(self, client_id: str, client_secret: str) -> User:
        """The user's token for their catalog client credentials (the secret is not kept).

        A client that sends Basic on every call gets the token its credentials were last exchanged for while that
        token has more than a fifth of its life (or 60 s, if that is less) left and the catalog still accepts it
        (checked at the catalog on every call, never from ``auth_cache_seconds``, so a rotated secret or revoked
        principal is refused on the next call as it was when every call exchanged): exchanging again would cost the
        catalog a password hash per call and mint a new token, hence a new delegated token, every second.
        """
        key = self._credentials_key(client_id, client_secret)
        cached = self._cached_basic(key)
        if cached is not None:
            try:
                self._check_at_catalog(cached)
                return self._user(cached, issued_token=True)
            except AuthenticationError:
                with self._lock:
                    self._basic.pop(key, None)
        body = self._token_request(
            client_credentials_form(client_id, client_secret, self.scope), f"the catalog rejected client {client_id!r}"
        )
        token = str(body["access_token"])
        now = time.time()
        with self._lock:
            self._basic = {k: v for k, v in self._basic.items() if v.refresh_at > now}
            self._basic[key] = _Cached(token, _lifetime(body, now))
        return self._user(token, issued_token=True)

    def _credentials_key(self, client_id: str, client_secret: str) -> str:
        """A keyed digest of the credentials: cache lookups never hold the secret, and the key dies with the process."""
        return self._keyed(f"basic\0{client_id}\0{client_secret}")

    def _token_key(self, token: str) -> str:
        """What an acceptance or a delegated token is cached under. Not :func:`fingerprint`: that names users in
        logs and is 64 bits, so a forged token matching a cached fingerprint would skip the catalog's check (with
        ``auth_cache_seconds``) and be handed that user's delegated token. A full keyed digest is unforgeable."""
        return self._keyed(f"token\0{token}")

    def _keyed(self, text: str) -> str:
        return hmac.new(self._cache_secret, text.encode(), hashlib.sha256).hexdigest()

    def _cached_basic(self, key: str) -> str | None:
        with self._lock:
            cached = self._basic.get(key)
        return cached.value if cached is not None and time.time() < cached.refresh_at else None

    def _user(self, token: str, *, issued_token: bool = False) -> User:
        return User(self._user_key(token), token, issued_token, authority=authority_of(token))

    def _user_key(self, token: str) -> str:
        subject = _subject_of(token)
        # the whole digest (not a short fingerprint): two users who present opaque tokens never share a key
        return f"user:{subject}" if subject else f"token:{identity_digest(token)}"

    def _check_at_catalog(self, token: str) -> None:
        url = f"{self.catalog_uri}/v1/config"
        try:
            response = self._http.get(
                url,
                params={"warehouse": self.warehouse},
                headers={"Authorization": f"Bearer {token}"},
                timeout=self.timeout,
            )
        except requests.RequestException as exc:
            reason = type(exc).__name__
            raise CatalogUnavailableError(f"cannot reach the catalog at {self.catalog_uri}: {reason}") from None
        status = response.status_code
        if status == 401:
            raise AuthenticationError(
                f"the catalog rejected the bearer token ({_oauth_error(response, token)})", status=401
            )
        if status == 429 or status >= 500:
            raise CatalogUnavailableError(f"the catalog answered HTTP {status}", status=503)
        if 200 <= status < 300 or (status in (403, 404) and _is_catalog_error(response, status)):
            return  # 200, or the catalog's own 403/404 for a warehouse the user cannot see: the token is valid
        # Anything else (a proxy's 403, 400, 431, a redirect) vouches for nothing: the user key comes from the
        # token's unverified subject, so an answer that is not the catalog's must not authenticate it.
        raise AuthenticationError(f"the catalog did not confirm the bearer token (HTTP {status})", status=401)

    def check_reader(self) -> None:
        """Log in as the reader once (its token is kept for the first user's exchange), so that a wrong reader
        secret fails ``sqe serve`` at start, naming the reader, rather than every user's first call. A catalog
        that cannot be reached raises :class:`CatalogUnavailableError`; a refusal, :class:`AuthenticationError`."""
        if not self.delegates:
            return
        try:
            self._reader()
        except _Refused as refusal:
            raise AuthenticationError(str(refusal), status=401) from None  # the public type: the operator sees it

    # -- the token a user's engine session uses ---------------------------------------------------------

    def catalog_token(self, user: User) -> str:
        """The delegated token for ``user`` (cached, re-exchanged before expiry), or their own token."""
        if not self.delegates:
            return user.token
        key = self._token_key(user.token)
        now = time.time()
        with self._lock:
            cached = self._delegated.get(key)
        if cached is not None and now < cached.refresh_at:
            return cached.value
        delegated = self._exchange(user.token)
        log.info("delegated token for %s exchanged as reader %r", short_identity(user.key), self.reader_client_id)
        with self._lock:
            self._delegated[key] = delegated
            self._forget_stale(now)
        return delegated.value

    def forget(self, user: User) -> None:
        """Drop what is cached for ``user``'s token (their session ended)."""
        key = self._token_key(user.token)
        with self._lock:
            self._delegated.pop(key, None)
            self._checked.pop(key, None)

    def _forget_unchecked(self, now: float) -> None:
        """Drop acceptances past their time: one entry per distinct token would otherwise stay for good."""
        for key in [k for k, until in self._checked.items() if until <= now]:
            del self._checked[key]

    def _forget_stale(self, now: float) -> None:
        for key in [k for k, v in self._delegated.items() if v.refresh_at <= now]:
            del self._delegated[key]

    def _exchange(self, subject_token: str) -> _Cached:
        """Exchange as the reader; a refusal of a *cached* reader token (``invalid_client``) re-fetches it once and
        retries.

        The catalog may have been restarted with another signing key, or revoked the reader's token: a cached
        reader token would otherwise be refused for every user until it expired.
        """
        actor, fresh = self._reader()
        try:
            return self._exchange_as(subject_token, actor)
        except _Refused as refusal:
            # Only the actor token's refusal: a refused subject would log in as the reader again on every call.
            if fresh or refusal.code != _ACTOR_REFUSED:
                raise
            log.info("the catalog refused the cached reader token of %r; fetching a new one", self.reader_client_id)
            actor, _ = self._reader(refused=actor)
            return self._exchange_as(subject_token, actor)

    def _exchange_as(self, subject_token: str, actor_token: str) -> _Cached:
        body = self._token_request(
            token_exchange_form(subject_token, actor_token), "the catalog refused to delegate for this user"
        )
        return _Cached(str(body["access_token"]), _lifetime(body, time.time()))

    def _reader(self, *, refused: str | None = None) -> tuple[str, bool]:
        """The server's own reader token (client_credentials), fetched anew before it expires or once the catalog
        refused it (``refused``); True if this call fetched it.

        Calls that need a new one at once (its refresh point, a catalog restarted with another signing key) wait
        for one login and share its token: each logging in would cost the catalog a password hash. A login that
        does not end within ``timeout`` no longer holds the others back (each then logs in as before)."""
        cached = self._usable_reader_token(refused)
        if cached is not None:
            return cached, False
        waited = self._reader_login.acquire(timeout=self.timeout)
        try:
            cached = self._usable_reader_token(refused)  # another call logged in while this one waited
            if cached is not None:
                return cached, False
            return self._reader_login_now(), True
        finally:
            if waited:
                self._reader_login.release()

    def _usable_reader_token(self, refused: str | None) -> str | None:
        with self._lock:
            cached = self._reader_token
        if cached is None or time.time() >= cached.refresh_at or cached.value == refused:
            return None
        return cached.value

    def _reader_login_now(self) -> str:
        now = time.time()
        # Never ``self.scope``: that narrows users' tokens to their roles, which the reader does not hold.
        form = client_credentials_form(self.reader_client_id or "", self.reader_client_secret or "", READER_SCOPE)
        refused = f"the catalog rejected the server's reader identity {self.reader_client_id!r}"
        body = self._token_request(form, refused)
        fresh = _Cached(str(body["access_token"]), _lifetime(body, now))
        with self._lock:
            self._reader_token = fresh
        return fresh.value

    def _token_request(self, form: dict[str, str], refused: str) -> dict[str, Any]:
        try:
            # Never following a redirect: requests would resend the form (a secret or tokens) to the host it names.
            response = self._http.post(self.token_url, data=form, timeout=self.timeout, allow_redirects=False)
        except requests.RequestException as exc:
            raise CatalogUnavailableError(f"cannot reach {self.token_url}: {type(exc).__name__}") from None
        if response.status_code in (400, 401, 403):
            # The user sees this message: blank out whatever was sent (the reader's token or secret among it).
            described = _oauth_error(response, *(form.get(name, "") for name in _SENT_SECRETS))
            raise _Refused(f"{refused} ({described})", oauth_error_code(response))
        if response.status_code != 200:
            raise CatalogUnavailableError(
                f"{self.token_url} answered HTTP {response.status_code}", status=response.status_code
            )
        try:
            body = response.json()
            if not isinstance(body, dict) or not isinstance(body.get("access_token"), str):
                raise ValueError
        except ValueError:
            raise CatalogProtocolError(f"{self.token_url} did not answer an OAuth token response") from None
        return body

    def close(self) -> None:
        self._http.close()


def _is_catalog_error(response: requests.Response, status: int) -> bool:
    """Whether the body is the Iceberg REST ErrorModel for ``status`` (the catalog's own refusal)."""
    try:
        body = response.json()
    except ValueError:
        return False
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and error.get("code") == status and isinstance(error.get("type"), str)


def _oauth_error(response: requests.Response, *sent: str) -> str:
    """The OAuth/ErrorModel error text of a refusal, one line, with the ``sent`` tokens and secrets blanked out: a
    catalog or proxy may quote its request, and the text goes to the Flight client."""
    return oauth_error(response, *sent, fallback=f"HTTP {response.status_code}", limit=200)


# The token request fields that hold a secret or a token (client credentials, RFC 8693 exchange).
_SENT_SECRETS = ("client_secret", "subject_token", "actor_token")
# RFC 6749 error sqe-catalog answers for an actor token it does not take (invalid, expired, foreign or revoked).
_ACTOR_REFUSED = "invalid_client"


class _Refused(AuthenticationError):
    """A refusal at the token endpoint, with its OAuth ``error`` code ("" when it has none)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message, status=401)
        self.code = code
