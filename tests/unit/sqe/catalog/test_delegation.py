"""DelegatedAuth against a loopback token endpoint speaking sqe-catalog's RFC 8693 dialect.

The endpoint issues client-credentials tokens with a short real lifetime and delegated tokens that expire no
later than their subject token (as ``sqe_catalog.auth.AuthStore.issue_delegated_token`` does); the e2e tests
run the same client against the real catalog.
"""

from __future__ import annotations

import json
import pickle
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sqe.catalog._auth import BearerAuth
from sqe.catalog._delegation import DelegatedAuth
from sqe.catalog._transport import RetryPolicy, make_session
from sqe.errors import AuthenticationError
from sqe.vocabulary import ACCESS_TOKEN_TYPE, TOKEN_EXCHANGE_GRANT

SECRETS = {"analyst": "analyst-secret-value", "engine": "engine-secret-value"}
LIFETIME = 2.0


@dataclass
class Endpoint:
    url: str
    expiry: dict[str, float] = field(default_factory=dict)  # token -> expires at
    issued: list[str] = field(default_factory=list)  # "cc:<client>" / "x:<subject>" in order
    refuse_next: list[tuple[int, str]] = field(default_factory=list)  # forced exchange refusals
    next_id: int = 0
    refused: int = 0  # exchanges answered from refuse_next
    input_lifetimes: bool = True  # False: client-credentials tokens come without expires_in (RFC 6749 allows it)

    def mint(self, prefix: str, expires_at: float) -> str:
        self.next_id += 1
        token = f"{prefix}-tok-{self.next_id}"
        self.expiry[token] = expires_at
        return token

    def answer(self, form: dict[str, str]) -> tuple[int, dict[str, object]]:
        now = time.time()
        if self.refuse_next and form.get("grant_type") == TOKEN_EXCHANGE_GRANT:
            status, error = self.refuse_next.pop(0)
            self.refused += 1
            return status, {"error": error, "error_description": f"refused; sent {form.get('subject_token')}"}
        if form.get("grant_type") == "client_credentials":
            client = form.get("client_id", "")
            if SECRETS.get(client) != form.get("client_secret"):
                return 401, {"error": "invalid_client", "error_description": "invalid client credentials"}
            self.issued.append(f"cc:{client}")
            if not self.input_lifetimes:
                return 200, {"access_token": self.mint(client, now + 3600)}
            return 200, {"access_token": self.mint(client, now + LIFETIME), "expires_in": LIFETIME}
        assert form["grant_type"] == TOKEN_EXCHANGE_GRANT
        assert form["subject_token_type"] == form["actor_token_type"] == ACCESS_TOKEN_TYPE
        subject, actor = form["subject_token"], form["actor_token"]
        if self.expiry.get(actor, 0) <= now:
            return 401, {"error": "invalid_client", "error_description": "actor_token rejected: bearer token expired"}
        if self.expiry.get(subject, 0) <= now:
            return 400, {"error": "invalid_grant", "error_description": "subject_token rejected: token expired"}
        self.issued.append(f"x:{subject}")
        expires_at = min(self.expiry[subject], now + LIFETIME)
        return 200, {"access_token": self.mint("delegated", expires_at), "expires_in": expires_at - now}


@pytest.fixture()
def endpoint() -> Iterator[Endpoint]:
    state = Endpoint("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers["Content-Length"])).decode()
            form = {k: v[0] for k, v in urllib.parse.parse_qs(raw).items()}
            status, body = state.answer(form)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v1/oauth/tokens"
    yield state
    server.shutdown()
    server.server_close()


def _delegated(endpoint: Endpoint, *, static_user_token: str = "", reader_secret: str = "") -> DelegatedAuth:
    session = make_session(RetryPolicy(max_retries=0))
    if static_user_token:
        user = BearerAuth(session, endpoint.url, static_token=static_user_token)
    else:
        user = BearerAuth(session, endpoint.url, client_id="analyst", client_secret=SECRETS["analyst"])
    reader = BearerAuth(session, endpoint.url, client_id="engine", client_secret=reader_secret or SECRETS["engine"])
    return DelegatedAuth(
        session, endpoint.url, end_user=user, reader=reader, end_user_name="analyst", reader_name="engine"
    )


def test_delegated_token_is_cached_then_exchanged_again_with_a_fresh_subject(endpoint: Endpoint) -> None:
    auth = _delegated(endpoint)
    first = auth.current_token()
    assert auth.current_token() == first and first.startswith("delegated-")  # cached inside its lifetime
    time.sleep(LIFETIME * 0.85)  # past the refresh point; the subject token has < half its life left
    second = auth.current_token()
    assert second != first and auth.exchanges == 2
    # the second exchange used a NEW subject token: with the old one it would be capped at the old expiry
    subjects = [entry for entry in endpoint.issued if entry.startswith("x:")]
    assert len(subjects) == 2 and subjects[0] != subjects[1]
    assert endpoint.issued.count("cc:analyst") == 2
    assert endpoint.expiry[second] > endpoint.expiry[first] + LIFETIME / 2


def _exchange_again_with_the_kept_inputs(auth: DelegatedAuth) -> None:
    """Forget the delegated token alone (as its refresh point does), keeping the subject and actor tokens."""
    BearerAuth.invalidate(auth)


# The refusal codes that call an input token stale, the input they name, and whether tokens come with a lifetime
# (``expires_in`` is optional: a token without one has no issue time either).
STALE_INPUTS = pytest.mark.parametrize(
    ("status", "code", "client", "lifetimes"),
    [
        (status, code, client, lifetimes)
        for status, code, client in ((400, "invalid_grant", "analyst"), (401, "invalid_client", "engine"))
        for lifetimes in (True, False)
    ],
)


@STALE_INPUTS
def test_a_kept_input_token_the_catalog_calls_stale_is_fetched_anew_once(
    endpoint: Endpoint, status: int, code: str, client: str, lifetimes: bool
) -> None:
    """Expired on the catalog's clock before ours, or revoked: fetched again, and the exchange tried once more."""
    endpoint.input_lifetimes = lifetimes
    auth = _delegated(endpoint)
    auth.current_token()
    _exchange_again_with_the_kept_inputs(auth)
    endpoint.refuse_next.append((status, code))
    assert auth.current_token().startswith("delegated-")
    assert endpoint.issued.count(f"cc:{client}") == 2 and auth.exchanges == 2


@STALE_INPUTS
def test_an_input_token_fetched_for_this_exchange_and_refused_is_not_fetched_again(
    endpoint: Endpoint, status: int, code: str, client: str, lifetimes: bool
) -> None:
    """A token fetched a moment ago is not stale: the refusal has another reason (a subject that may not be
    delegated, an actor that is no reader), and a retry would cost a login and an exchange for the same answer."""
    endpoint.input_lifetimes = lifetimes
    auth = _delegated(endpoint)
    endpoint.refuse_next.append((status, code))
    with pytest.raises(AuthenticationError, match=code):
        auth.current_token()
    assert endpoint.issued.count(f"cc:{client}") == 1 and endpoint.refused == 1


def test_refusal_is_one_typed_line_naming_user_and_reader_without_tokens(endpoint: Endpoint) -> None:
    auth = _delegated(endpoint)
    endpoint.refuse_next.append((400, "unauthorized_client"))
    with pytest.raises(AuthenticationError) as caught:
        auth.current_token()
    message = str(caught.value)
    assert "'analyst'" in message and "'engine'" in message and "unauthorized_client" in message
    assert "\n" not in message and caught.value.status == 400
    assert "-tok-" not in message  # the description echoed the subject token: it is blanked out
    assert not any(secret in message + repr(auth) for secret in SECRETS.values())


def test_given_end_user_token_is_not_retried_and_the_error_says_so(endpoint: Endpoint) -> None:
    auth = _delegated(endpoint, static_user_token="given-user-token-value")
    with pytest.raises(AuthenticationError) as caught:
        auth.current_token()
    assert "invalid_grant" in str(caught.value) and "given-user-token-value" not in str(caught.value)
    assert "cc:analyst" not in endpoint.issued


def test_wrong_reader_secret_fails_closed_without_the_secret(endpoint: Endpoint) -> None:
    auth = _delegated(endpoint, reader_secret="wrong-reader-secret")
    with pytest.raises(AuthenticationError) as caught:
        auth.current_token()
    assert "'engine'" in str(caught.value) and "wrong-reader-secret" not in str(caught.value)
    assert not [entry for entry in endpoint.issued if entry.startswith("x:")]


def test_repr_and_pickle_reveal_nothing(endpoint: Endpoint) -> None:
    auth = _delegated(endpoint)
    auth.current_token()
    text = repr(auth)
    assert "analyst" in text and "engine" in text and "-tok-" not in text
    assert not any(secret in text for secret in SECRETS.values())
    with pytest.raises(TypeError):
        pickle.dumps(auth)
