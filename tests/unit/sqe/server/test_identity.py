"""The server authenticates a bearer token only when the catalog itself vouches for it.

The user key comes from the token's (unverified) subject, so an answer to ``/v1/config`` that is not the
catalog's own - a throttling 429, a proxy's bare 403, a 400 or 431 - must never let a forged token in as that
subject. A real loopback HTTP server plays the catalog (or the proxy in front of it).
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import hashlib
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sqe.errors import AuthenticationError, CatalogUnavailableError
from sqe.server.identity import IdentityBroker, User, authority_of, fingerprint
from tests.unit.sqe.catalog.test_token_redirects import redirecting

FORGED = base64.urlsafe_b64encode(json.dumps({"sub": "alice"}).encode()).decode().rstrip("=") + ".forged"


def _send(handler: BaseHTTPRequestHandler, status: int, body: bytes) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@contextlib.contextmanager
def _catalog_answering(status: int, body: bytes) -> Iterator[str]:
    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            _send(self, status, body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def _error_model(status: int) -> bytes:
    return json.dumps({"error": {"message": "no", "type": "ForbiddenException", "code": status}}).encode()


@pytest.mark.parametrize(
    ("status", "body"),
    [(400, b""), (431, b""), (403, b"<html>proxy says no</html>"), (404, b"{}"), (302, b""), (403, _error_model(404))],
)
def test_an_answer_that_is_not_the_catalogs_authenticates_nobody(status: int, body: bytes) -> None:
    refused = f"did not confirm the bearer token \\(HTTP {status}\\)"
    with _catalog_answering(status, body) as uri, pytest.raises(AuthenticationError, match=refused):
        IdentityBroker(uri, "wh").authenticate_bearer(FORGED)


@pytest.mark.parametrize("status", [429, 503])
def test_a_throttled_or_failing_catalog_is_unavailable_not_a_yes(status: int) -> None:
    with _catalog_answering(status, b"") as uri, pytest.raises(CatalogUnavailableError):
        IdentityBroker(uri, "wh").authenticate_bearer(FORGED)


@pytest.mark.parametrize(("status", "body"), [(200, b"{}"), (403, _error_model(403)), (404, _error_model(404))])
def test_the_catalogs_own_answers_confirm_the_token(status: int, body: bytes) -> None:
    with _catalog_answering(status, body) as uri:
        assert IdentityBroker(uri, "wh").authenticate_bearer(FORGED).key == "user:alice"


def test_a_401_is_a_rejected_token() -> None:
    with _catalog_answering(401, _error_model(401)) as uri, pytest.raises(AuthenticationError, match="rejected"):
        IdentityBroker(uri, "wh").authenticate_bearer(FORGED)


def test_accepted_tokens_past_their_cache_time_are_forgotten() -> None:
    # Found by review: with auth_cache_seconds set, one entry per distinct token stayed for the server's life.
    # A real clock, and a cache time some twenty times what the twenty checks take (about 65 ms), so that a loaded
    # machine does not forget the first acceptances before the count below (0.5 s left a margin of about 8x).
    with _catalog_answering(200, b"{}") as uri:
        broker = IdentityBroker(uri, "wh", auth_cache_seconds=1.5)
        for index in range(20):
            broker.authenticate_bearer(f"{FORGED}{index}")
        assert len(broker._checked) == 20
        time.sleep(1.6)  # every acceptance is past its (real, short) cache time
        broker.authenticate_bearer(FORGED)
        assert len(broker._checked) == 1


def test_a_cached_acceptance_is_keyed_by_a_full_keyed_digest_not_the_logged_fingerprint() -> None:
    # Found by review: acceptances and delegated tokens were cached under the token's 64-bit fingerprint, the one
    # user keys and log lines show; a forged token hashing to it would skip the catalog's check within
    # auth_cache_seconds and get that user's delegated token. The key is now a 256-bit HMAC under a process key.
    with _catalog_answering(200, b"{}") as uri:
        brokers = [IdentityBroker(uri, "wh", auth_cache_seconds=60) for _ in range(2)]
        for broker in brokers:
            broker.authenticate_bearer(FORGED)
    [first], [second] = (list(broker._checked) for broker in brokers)
    assert fingerprint(FORGED) not in first and len(bytes.fromhex(first)) == 32
    assert first != second, "keyed per process (per broker): nothing outside it can compute the key"


class _RotatingCatalog(BaseHTTPRequestHandler):
    """A catalog with one principal: its secret exchanges for ``token``, and ``rotated`` revokes both."""

    rotated = False
    exchanges = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).exchanges += 1
        if type(self).rotated:
            _send(self, 401, json.dumps({"error": "invalid_client"}).encode())
        else:
            _send(self, 200, json.dumps({"access_token": FORGED, "expires_in": 3600}).encode())

    def do_GET(self) -> None:
        _send(self, 401, _error_model(401)) if type(self).rotated else _send(self, 200, b"{}")

    def log_message(self, *args: object) -> None:
        pass


def test_basic_credentials_whose_secret_was_rotated_are_refused_on_the_next_call_despite_auth_cache() -> None:
    # Found by review: Basic credentials reuse their token while it is fresh, and that token's acceptance was
    # taken from the auth_cache_seconds cache, so the old secret kept working for that long after a rotation
    # (before the reuse every call exchanged the secret and was refused at once).
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RotatingCatalog)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    try:
        broker = IdentityBroker(f"http://127.0.0.1:{server.server_port}", "wh", auth_cache_seconds=60)
        assert broker.authenticate_basic("alice-id", "old-secret").key == "user:alice"
        assert broker.authenticate_basic("alice-id", "old-secret").key == "user:alice"
        assert _RotatingCatalog.exchanges == 1  # the second call reused the token
        _RotatingCatalog.rotated = True
        with pytest.raises(AuthenticationError, match="rejected client 'alice-id'"):
            broker.authenticate_basic("alice-id", "old-secret")
    finally:
        server.shutdown()
        server.server_close()


def _claims_token(**claims: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=") + ".signature"


def test_the_authority_of_a_token_is_its_claims_but_when_it_was_issued() -> None:
    """A refreshed token keeps its client session; another role scope, actor or an opaque token does not."""
    wide = authority_of(_claims_token(sub="alice", roles=None, iat=1, exp=2))
    assert authority_of(_claims_token(sub="alice", roles=None, iat=5, exp=9, jti="x")) == wide
    assert authority_of(_claims_token(sub="alice", roles=["reader"], iat=1, exp=2)) != wide
    assert authority_of(_claims_token(sub="alice", roles=None, act={"sub": "reader"}, iat=1, exp=2)) != wide
    assert authority_of(_claims_token(sub="alice", roles=None, gen=2, iat=1, exp=2)) != wide
    assert authority_of("opaque-one") != authority_of("opaque-two")


def test_its_repr_names_the_catalog_without_a_password_in_its_uri() -> None:
    broker = IdentityBroker("http://alice:Pw9SECRET@127.0.0.1:9/api/catalog?token=T0kSECRET", "wh")
    assert "Pw9SECRET" not in repr(broker) and "T0kSECRET" not in repr(broker)
    assert "http://alice:***@127.0.0.1:9/api/catalog?token=***" in repr(broker), repr(broker)


OPAQUE = "opaque-token-without-claims-7f3a"


def test_a_user_known_only_by_an_opaque_token_is_keyed_by_its_whole_digest() -> None:
    """Found by review: such a user was keyed ``token:<16 hex>`` (64 bits of the token's SHA-256): two users whose
    tokens shared those 64 bits would have shared client sessions, limits and mount stores. The key now holds the
    whole digest; logs and reprs show 16 hex digits of it, never the token."""
    with _catalog_answering(200, b"{}") as uri:
        user = IdentityBroker(uri, "wh").authenticate_bearer(OPAQUE)
    assert user.key == f"token:{hashlib.sha256(OPAQUE.encode()).hexdigest()}"
    assert len(bytes.fromhex(user.key.removeprefix("token:"))) >= 16
    assert repr(user) == f"User(key='token:{fingerprint(OPAQUE)}', issued_token=False)"
    assert OPAQUE not in repr(user) and user.authority not in repr(user)


READER_ID, READER_SECRET = "reader-id", "reader-Secret-6cd1"


class _EchoingCatalog(BaseHTTPRequestHandler):
    """A catalog (or a proxy in front of it) whose refusals quote what it was sent: secrets and tokens included.

    The reader's client credentials get ``reader-token-<n>`` (n counts the reader's logins); any other client is
    refused. An exchange whose actor token is not in ``accepted_actors`` is refused ``invalid_client``, one whose
    subject token ends in ``refused`` ``invalid_grant``; a bearer token ending in ``revoked`` gets a 401."""

    reader_logins = 0
    exchanges = 0
    accepted_actors: tuple[str, ...] = ()
    reader_token = "reader-token-"  # the reader's n-th token: this and n
    cut = 0  # quote each value without its last ``cut`` characters (a catalog cutting its quotes short)
    refusals_together: threading.Barrier | None = None  # refused actors are answered only once all are in

    percent_encoded = False  # quote each value as its form body had it

    @classmethod
    def quoted(cls, value: str | None) -> str:
        kept = (value or "")[: len(value or "") - cls.cut]
        return urllib.parse.quote_plus(kept) if cls.percent_encoded else kept

    def do_POST(self) -> None:
        sent = urllib.parse.parse_qs(self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode())
        form = {key: values[0] for key, values in sent.items()}
        cls = type(self)
        if form.get("grant_type") == "client_credentials":
            if form.get("client_id") == READER_ID and form.get("client_secret") == READER_SECRET:
                cls.reader_logins += 1
                _send(self, 200, _json({"access_token": f"{cls.reader_token}{cls.reader_logins}"}))
            else:
                described = f"no client {form.get('client_id')} with {cls.quoted(form.get('client_secret'))}"
                _send(self, 401, _json({"error": "invalid_client", "error_description": described}))
            return
        cls.exchanges += 1
        subject, actor = form.get("subject_token", ""), form.get("actor_token", "")
        error = "invalid_client" if actor not in cls.accepted_actors else "invalid_grant"
        if error == "invalid_grant" and not subject.endswith("refused"):
            _send(self, 200, _json({"access_token": f"delegated-{subject}", "expires_in": 3600}))
            return
        if error == "invalid_client" and cls.refusals_together is not None:
            cls.refusals_together.wait(timeout=60)  # a guard against a hang only: the test asserts no time
        described = f"cannot exchange {cls.quoted(subject)} with {cls.quoted(actor)}"
        _send(self, 400, _json({"error": error, "error_description": described}))

    def do_GET(self) -> None:
        token = self.headers.get("Authorization", "").removeprefix("Bearer ")
        if token.endswith("revoked"):
            message = f"no token {type(self).quoted(token)}"
            _send(self, 401, _json({"error": {"message": message, "type": "NotAuthorized", "code": 401}}))
        else:
            _send(self, 200, b"{}")

    def log_message(self, *args: object) -> None:
        pass


def _json(body: object) -> bytes:
    return json.dumps(body).encode()


@contextlib.contextmanager
def _echoing_catalog(*accepted_actors: str) -> Iterator[tuple[str, type[_EchoingCatalog]]]:
    """The catalog's URI and its handler class (a fresh one per catalog: its counters and settings)."""
    handler = type("Echoing", (_EchoingCatalog,), {"accepted_actors": accepted_actors})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", handler
    finally:
        server.shutdown()
        server.server_close()


def _delegating(uri: str, secret: str = READER_SECRET) -> IdentityBroker:
    return IdentityBroker(uri, "wh", reader_client_id=READER_ID, reader_client_secret=secret)


def _refusal(call: Callable[[], object]) -> str:
    with pytest.raises(AuthenticationError) as refused:
        call()
    return str(refused.value)


def test_a_refusal_quoting_what_the_broker_sent_never_shows_a_secret_or_token_to_the_user() -> None:
    """Found by review: the broker put the catalog's error text into the error the Flight client gets, unredacted
    (only the embedded exchange blanked out what it sent). A catalog or proxy quoting its request handed the user
    the reader's token (with it, the user's own token exchanges for raw credentials of their restricted tables),
    the reader's secret, or a secret or token of their own in a message meant for logs and terminals."""
    user_secret, revoked = "alice-Secret-91f0", f"{FORGED}revoked"
    with _echoing_catalog() as (uri, _catalog):
        broker = _delegating(uri)
        user = broker.authenticate_bearer(FORGED)
        shown = [
            _refusal(lambda: broker.catalog_token(user)),  # the exchange: the subject and the reader's token
            _refusal(lambda: _delegating(uri, "reader-Wrong-Secret-1a2b").catalog_token(user)),  # reader's login
            _refusal(lambda: broker.authenticate_basic("alice-id", user_secret)),
            _refusal(lambda: broker.authenticate_bearer(revoked)),
        ]
    assert "cannot exchange" in shown[0] and "rejected client 'alice-id'" in shown[2], shown
    for sent in (FORGED, "reader-token-1", "reader-Wrong-Secret-1a2b", user_secret, revoked):
        assert not [text for text in shown if sent in text], f"{sent!r} shown in {shown}"


def test_a_refused_subject_does_not_make_the_broker_log_in_as_the_reader_again() -> None:
    """Found by review: any refused exchange with a cached reader token fetched a new reader token and exchanged
    once more, so a user the catalog will not delegate for (their principal is a reader, say) cost the catalog a
    client-credentials login (a password hash) and a second exchange on every call. Only a refused actor token
    (``invalid_client``) is a reason to log in again."""
    with _echoing_catalog("reader-token-1") as (uri, catalog):
        broker = _delegating(uri)
        assert broker.catalog_token(broker.authenticate_bearer(FORGED)) == f"delegated-{FORGED}"
        refused = broker.authenticate_bearer(f"{FORGED}refused")
        for _ in range(3):
            with pytest.raises(AuthenticationError, match="refused to delegate"):
                broker.catalog_token(refused)
    assert (catalog.reader_logins, catalog.exchanges) == (1, 4)


def test_a_refused_reader_token_is_fetched_again_once_and_the_exchange_retried() -> None:
    """The catalog restarted with another signing key, or revoked the reader's token: one new login, one retry."""
    with _echoing_catalog("reader-token-1") as (uri, catalog):
        broker = _delegating(uri)
        broker.catalog_token(broker.authenticate_bearer(FORGED))
        catalog.accepted_actors = ("reader-token-2",)  # reader-token-1 is no longer taken
        other = f"{FORGED}other"
        assert broker.catalog_token(broker.authenticate_bearer(other)) == f"delegated-{other}"
    assert (catalog.reader_logins, catalog.exchanges) == (2, 3)


def test_calls_refused_together_for_a_stale_reader_token_share_one_new_login() -> None:
    """Found by review: every call whose exchange the catalog refused for the cached reader token (a catalog
    restarted with another signing key) logged in as the reader itself, so a busy server cost the catalog a
    password hash per call in flight. They now wait for one login and share its token."""
    calls = 4
    with _echoing_catalog("reader-token-1") as (uri, catalog):
        broker = _delegating(uri)
        broker.catalog_token(broker.authenticate_bearer(FORGED))
        # The catalog no longer takes reader-token-1; it takes any later one (however many logins there are).
        catalog.accepted_actors = tuple(f"reader-token-{n}" for n in range(2, calls + 2))
        catalog.refusals_together = threading.Barrier(calls)  # every call is refused before any logs in again
        users = [broker.authenticate_bearer(f"{FORGED}{i}") for i in range(calls)]
        with concurrent.futures.ThreadPoolExecutor(calls) as pool:
            delegated = list(pool.map(broker.catalog_token, users))
    assert delegated == [f"delegated-{user.token}" for user in users]
    assert catalog.reader_logins == 2, "one login for the first token, one shared new one"


# Shaped like sqe-catalog's tokens: base64url claims, a dot, a base64url signature.
SIGNED_READER = "eyJjaWQiOiJyZWFkZXItaWQiLCJzdWIiOiJzcWUtZW5naW5lIn0.c2lnbmF0dXJlLW9mLXRoZS1yZWFkZXJz-"
SIGNED_USER = "eyJjaWQiOiJhbGljZS1pZCIsInN1YiI6ImFsaWNlIn0.c2lnbmF0dXJlLW9mLWFsaWNlcy10b2tlbg"


def test_a_refusal_quoting_a_token_cut_short_never_shows_most_of_it() -> None:
    """Found by review: only whole tokens and secrets were blanked out, so a catalog or proxy quoting them cut
    short (its own limit on a message) showed all of a token but its last characters: whoever reads the message
    can try the few left at the catalog. Any piece of 16 characters or more of what was sent is blanked out."""
    reader_secret = "reader-Wrong-Secret-1a2b3c4d5e6f"
    with _echoing_catalog() as (uri, catalog):
        catalog.reader_token, catalog.cut = SIGNED_READER, 2
        broker = _delegating(uri)
        user = broker.authenticate_bearer(SIGNED_USER)
        shown = [
            _refusal(lambda: broker.catalog_token(user)),  # the exchange: the user's and the reader's token
            _refusal(lambda: _delegating(uri, reader_secret).catalog_token(user)),  # the reader's login
            _refusal(lambda: broker.authenticate_bearer(f"{SIGNED_USER}revoked")),
        ]
    assert all(text.count("***") >= 1 for text in shown) and "cannot exchange *** with ***" in shown[0], shown
    for sent in (SIGNED_USER, f"{SIGNED_READER}1", reader_secret):
        assert not [text for text in shown if sent[:16] in text], f"a piece of {sent!r} shown in {shown}"


def test_a_refusal_quoting_a_secret_as_its_form_body_had_it_never_shows_it() -> None:
    """Found by review: only the secrets as given were blanked out, so a catalog or proxy quoting the form body it
    received showed a secret with reserved characters percent-encoded (``p%40ss%2Bword``): the user's password, or
    the reader's secret, in a message meant for logs and terminals."""
    user_secret, reader_secret = "alice+Secret/91f0@x", "reader Wrong&Secret=1a2b"
    with _echoing_catalog() as (uri, catalog):
        catalog.percent_encoded = True
        shown = [
            _refusal(
                lambda: _delegating(uri, reader_secret).catalog_token(_delegating(uri).authenticate_bearer(FORGED))
            ),
            _refusal(lambda: _delegating(uri).authenticate_basic("alice-id", user_secret)),
        ]
    assert "rejected client 'alice-id' (no client alice-id with ***)" in shown[1], shown
    for sent in (user_secret, reader_secret):
        encoded = {urllib.parse.quote_plus(sent), urllib.parse.quote(sent, safe="")}
        assert not [text for text in shown for form in encoded if form in text], f"{sent!r} shown in {shown}"


@pytest.mark.parametrize("status", [307, 308])
def test_a_redirected_token_request_of_the_broker_is_not_followed(status: int) -> None:
    """Found by review: the broker's token requests (a user's Basic secret, the reader's login, an exchange)
    followed a 307 or 308 and resent their form, secret included, to the host it named."""
    with redirecting(status) as (uri, received):
        with pytest.raises(CatalogUnavailableError, match=rf"answered HTTP {status}") as basic:
            IdentityBroker(uri, "wh").authenticate_basic("alice-id", "ALICE-SECRET")
        with pytest.raises(CatalogUnavailableError, match=rf"answered HTTP {status}") as reader:
            _delegating(uri).catalog_token(User("user:alice", "USER-TOKEN", authority="all roles"))
    assert received == []
    assert "ALICE-SECRET" not in str(basic.value)
    assert READER_SECRET not in str(reader.value) and "USER-TOKEN" not in str(reader.value)
