"""The one catalog-error translator: sqe-catalog's real ErrorModel answers, over loopback HTTP, become SQE's
typed errors by their ``type`` (never by message text), with the HTTP status as the fallback."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from pyiceberg.catalog.rest.response import _handle_non_200_response
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException
from pyiceberg.exceptions import NoSuchNamespaceError as PyNoSuchNamespaceError

import sqe_catalog.errors as catalog
from sqe.catalog.errors import catalog_error, error_for_status, translate_error
from sqe.errors import (
    AuthenticationError,
    CatalogError,
    CatalogUnavailableError,
    CommitConflictError,
    CommitStateUnknownError,
    IntegrityError,
    NoSuchNamespaceError,
    NoSuchTableError,
    PermissionDeniedError,
    RestrictionsNotSupportedError,
)


class _Answer:
    status = 200
    body = b"{}"
    content_type = "application/json"


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, type[_Answer]]]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(_Answer.status)
            self.send_header("Content-Type", _Answer.content_type)
            self.send_header("Content-Length", str(len(_Answer.body)))
            self.end_headers()
            self.wfile.write(_Answer.body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/x", _Answer
    httpd.shutdown()
    httpd.server_close()


def answer(
    server: tuple[str, type[_Answer]], status: int, body: bytes, content_type: str, token: str = ""
) -> requests.Response:
    url, state = server
    state.status, state.body, state.content_type = status, body, content_type
    return requests.get(url, timeout=5, headers={"Authorization": f"Bearer {token}"} if token else {})


def catalog_answer(server: tuple[str, type[_Answer]], error: catalog.CatalogError) -> requests.Response:
    return answer(server, error.status, json.dumps(error.to_json()).encode(), "application/json")


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        # Messages chosen to mislead a text matcher: only the ErrorModel type may decide.
        (
            catalog.NoSuchNamespaceError("table ns.t cannot be loaded: namespace ns does not exist"),
            NoSuchNamespaceError,
        ),
        (catalog.NoSuchTableError("namespace ns exists but has no such table"), NoSuchTableError),
        (catalog.NotAuthorizedError("token expired"), AuthenticationError),
        (catalog.ForbiddenError("principal lacks TABLE_READ_DATA"), PermissionDeniedError),
        (catalog.NotAcceptableError("declare the capability"), RestrictionsNotSupportedError),
        (catalog.CommitFailedError("requirement failed"), CommitConflictError),
        (catalog.AlreadyExistsError("table exists"), CommitConflictError),
        (catalog.UnprocessableEntityError("bad update"), IntegrityError),
        (catalog.ServiceUnavailableError("STS unreachable"), CatalogUnavailableError),
        (catalog.CatalogError("internal"), CatalogUnavailableError),
        (catalog.BadRequestError("bad identifier"), CatalogError),
    ],
)
def test_catalog_error_models_map_by_type(
    server: tuple[str, type[_Answer]], error: catalog.CatalogError, expected: type[CatalogError]
) -> None:
    mapped = error_for_status(catalog_answer(server, error), "table wh.ns.t")
    assert type(mapped) is expected
    assert mapped.status == error.status
    assert str(mapped).count("\n") == 0 and "wh.ns.t" in str(mapped) and error.message in str(mapped)


def test_an_untyped_answer_maps_by_status(server: tuple[str, type[_Answer]]) -> None:
    not_found = answer(server, 404, b'{"error": {"message": "namespace gone", "code": 404}}', "application/json")
    assert type(error_for_status(not_found, "table wh.ns.t")) is NoSuchTableError
    html = answer(server, 502, b"<html>bad gateway\nproxy details</html>", "text/html")
    mapped = error_for_status(html, "table wh.ns.t")
    assert type(mapped) is CatalogUnavailableError and mapped.status == 502
    assert "<html>bad gateway" in str(mapped) and "proxy details" not in str(mapped)


# The two cuts: an ErrorModel's message at 500 characters, a body that is none at 200.
@pytest.mark.parametrize(("content_type", "cut"), [("application/json", 500), ("text/plain", 200)])
def test_a_long_message_is_cut_after_its_credentials_are_taken_out(
    server: tuple[str, type[_Answer]], content_type: str, cut: int
) -> None:
    """Cut first, a message would end inside a URL's password, with no '@' left to show it is one."""
    head = " http://alice:PwSECRET"
    message = "x" * (cut - len(head) + 2) + head + "password0123@127.0.0.1:1/warehouse"
    body = json.dumps({"error": {"message": message, "code": 400}}) if content_type == "application/json" else message
    mapped = error_for_status(answer(server, 400, body.encode(), content_type), "table wh.ns.t")
    assert type(mapped) is CatalogError and "http://alice:***" in str(mapped), str(mapped)
    assert "PwSE" not in f"{mapped} {mapped!r}"  # before: the password up to the cut


def test_an_unknown_type_falls_back_to_the_status() -> None:
    assert type(catalog_error(403, "SomeVendorException", "no", "t")) is PermissionDeniedError
    assert type(catalog_error(418, "SomeVendorException", "no", "t")) is CatalogError


def test_pyiceberg_exceptions_without_an_answer_map_by_class() -> None:
    assert type(translate_error(PyNoSuchNamespaceError("ns"), "listing tables of wh")) is NoSuchNamespaceError
    conflict = translate_error(CommitFailedException("lost the race\ntrace"), "commit to wh.ns.t")
    assert type(conflict) is CommitConflictError and conflict.status == 409 and "trace" not in str(conflict)


def translated_from(response: requests.Response, raised: Exception, what: str) -> CatalogError:
    """``raised`` as pyiceberg raises it (from the HTTPError of ``response``), translated."""
    try:
        response.raise_for_status()
    except requests.HTTPError as http_error:
        raised.__cause__ = http_error
    return translate_error(raised, what)


def test_pyiceberg_exceptions_with_an_answer_map_by_its_type(server: tuple[str, type[_Answer]]) -> None:
    response = catalog_answer(server, catalog.NoSuchNamespaceError("namespace ns does not exist"))
    mapped = translated_from(response, PyNoSuchNamespaceError("pyiceberg's wording"), "table wh.ns.t")
    assert type(mapped) is NoSuchNamespaceError and "namespace ns does not exist" in str(mapped)


def test_a_commit_of_unknown_outcome_is_never_a_plain_unavailable_error(server: tuple[str, type[_Answer]]) -> None:
    """A 500/502/504 to a commit (pyiceberg's CommitStateUnknownException) may have landed: not retryable."""
    body = json.dumps({"error": {"message": "upstream reset", "type": "BadGateway", "code": 502}}).encode()
    response = answer(server, 502, body, "application/json")
    mapped = translated_from(response, CommitStateUnknownException("BadGateway: upstream reset"), "commit to wh.ns.t")
    assert type(mapped) is CommitStateUnknownError and not isinstance(mapped, CatalogUnavailableError)
    assert mapped.status == 502 and "it may have landed" in str(mapped) and "HTTP 502" in str(mapped)
    unanswered = translate_error(CommitStateUnknownException("commit outcome unknown: timed out"), "commit to wh.ns.t")
    assert type(unanswered) is CommitStateUnknownError and unanswered.status is None


_JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJib2IifQ.catalogSIGsecret9"


@pytest.mark.parametrize(
    "body",
    [
        # Polaris's and Lakekeeper's ErrorModel, the token named by its scheme or quoted bare
        {"error": {"message": f"Invalid token Bearer {_JWT}", "type": "NotAuthorizedException", "code": 401}},
        {"error": {"message": f"token '{_JWT}' is expired", "type": "UnauthorizedException", "code": 401}},
        # Gravitino's shape has no "error" member: the body's own first line is quoted
        {"code": 1002, "type": "UnauthorizedException", "message": f"Bearer {_JWT} rejected", "stack": []},
        {"code": 1002, "message": "bad request", "request": {"access_token": "opaqueTOKEN123secret"}},
    ],
)
def test_a_catalog_answer_quoting_a_token_never_shows_it(server: tuple[str, type[_Answer]], body: object) -> None:
    mapped = error_for_status(answer(server, 401, json.dumps(body).encode(), "application/json"), "table wh.ns.t")
    shown = f"{mapped} {mapped!r}"
    assert "***" in shown and "catalogSIGsecret9" not in shown and "opaqueTOKEN123secret" not in shown, shown


# A delegated token as sqe-catalog issues them: base64url JSON, a dot, a base64url HMAC.
DELEGATED = "eyJhY3QiOnsic3ViIjoic3FlLWVuZ2luZSJ9LCJzdWIiOiJhbmFseXN0In0.c2lnbmF0dXJlLW9mLXRoZS1jYXRhbG9n"


@pytest.mark.parametrize("content_type", ["application/json", "text/plain"])
def test_the_bearer_token_the_request_carried_never_reaches_the_message(
    server: tuple[str, type[_Answer]], content_type: str
) -> None:
    """Found by review: a catalog or proxy quoting the token it was sent put it into the error, which ``sqe serve``
    hands to the Flight client. There the token is a delegated one: with it the user could load their restricted
    tables at the catalog directly, raw credentials included. It is blanked out before the message is cut."""
    quoted = f"token {DELEGATED} is not valid for this warehouse"
    body = json.dumps({"error": {"message": quoted, "type": "NotAuthorizedException", "code": 401}})
    sent = body if content_type == "application/json" else quoted
    mapped = error_for_status(answer(server, 401, sent.encode(), content_type, DELEGATED), "table wh.ns.t")
    assert isinstance(mapped, AuthenticationError if content_type == "application/json" else CatalogError)
    assert "is not valid for this warehouse" in str(mapped), str(mapped)
    assert DELEGATED not in f"{mapped} {mapped!r}" and DELEGATED[:40] not in str(mapped)
    cut = "x" * (480 - len("token ")) + f" token {DELEGATED}"  # the 500-character cut falls inside the token
    long = json.dumps({"error": {"message": cut, "code": 400}}).encode()
    assert DELEGATED[:10] not in str(error_for_status(answer(server, 400, long, "application/json", DELEGATED), "t"))


@pytest.mark.parametrize("content_type", ["application/json", "text/plain"])
def test_a_commit_of_unknown_outcome_never_quotes_the_bearer_token(
    server: tuple[str, type[_Answer]], content_type: str
) -> None:
    """Found by review: a commit's 500/502/504 (pyiceberg's CommitStateUnknownException) took its detail from
    pyiceberg's message, which quotes the answer (the ErrorModel message, or a non-JSON body whole), without the
    bearer-token blanking of ``error_for_status``: a catalog or proxy quoting the delegated token showed it."""
    quoted = f"upstream reset while checking token {DELEGATED}"
    body = json.dumps({"error": {"message": quoted, "type": "BadGateway", "code": 502}})
    response = answer(
        server, 502, (body if content_type == "application/json" else quoted).encode(), content_type, DELEGATED
    )
    with pytest.raises(requests.HTTPError) as failed:
        response.raise_for_status()
    with pytest.raises(CommitStateUnknownException) as raised:  # pyiceberg's own translation, as in commit_table
        _handle_non_200_response(failed.value, {502: CommitStateUnknownException})
    mapped = translate_error(raised.value, "commit to wh.ns.t")
    assert type(mapped) is CommitStateUnknownError and "upstream reset while checking token" in str(mapped), mapped
    assert DELEGATED not in f"{mapped} {mapped!r}" and DELEGATED[:40] not in str(mapped), str(mapped)


@pytest.mark.parametrize("content_type", ["application/json", "text/plain"])
def test_the_bearer_token_quoted_cut_short_never_reaches_the_message(
    server: tuple[str, type[_Answer]], content_type: str
) -> None:
    """Found by review: only the whole token was blanked out, so a catalog or proxy quoting it cut short (its own
    limit on a message) showed all of it but its last characters, which whoever reads the message can try at the
    catalog. Any piece of 16 characters or more of it is blanked out; the rest of the message stays."""
    quoted = f"token {DELEGATED[:-3]}... is not valid; token ...{DELEGATED[30:]} neither"
    body = json.dumps({"error": {"message": quoted, "type": "NotAuthorizedException", "code": 401}})
    sent = body if content_type == "application/json" else quoted
    shown = str(error_for_status(answer(server, 401, sent.encode(), content_type, DELEGATED), "table wh.ns.t"))
    assert "token ***... is not valid; token ...*** neither" in shown, shown
