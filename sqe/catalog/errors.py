"""The one translator from a catalog's answer to SQE's exception tree.

Every catalog failure the engine sees — an HTTP answer to SQE's own requests, or an exception pyiceberg raised
for its calls (commits, create, namespaces) — becomes an ``SQEError`` here, keyed by the Iceberg REST
``ErrorModel`` ``type`` when the catalog sent one and by the HTTP status otherwise. Never by message text: a
message is for people and may say anything. Messages are one line and carry only the catalog's own message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import requests
from pyiceberg.exceptions import (
    CommitFailedException,
    CommitStateUnknownException,
    ForbiddenError,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    RESTError,
    TableAlreadyExistsError,
    UnauthorizedError,
)
from pyiceberg.exceptions import NoSuchNamespaceError as PyNoSuchNamespaceError
from pyiceberg.exceptions import NoSuchTableError as PyNoSuchTableError

from sqe import vocabulary
from sqe._text import MAX_MESSAGE_CHARS, first_line, without_secrets
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

__all__ = [
    "PYICEBERG_CATALOG_ERRORS",
    "catalog_error",
    "commit_state_unknown",
    "error_for_status",
    "translate_error",
    "typed_catalog_error",
]

# pyiceberg's catalog exceptions do not share a base class; these are the ones its REST calls raise.
PYICEBERG_CATALOG_ERRORS: tuple[type[Exception], ...] = (
    RESTError,
    CommitFailedException,
    TableAlreadyExistsError,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    PyNoSuchTableError,
    PyNoSuchNamespaceError,
)


@dataclass(frozen=True)
class _Kind:
    """One kind of catalog failure: the SQE error it becomes and its one-line message."""

    error: type[CatalogError]
    template: str  # formatted with what, detail and status

    def build(self, what: str, detail: str, status: int) -> CatalogError:
        return self.error(self.template.format(what=what, detail=detail, status=status), status)


_unauthorized = _Kind(AuthenticationError, "catalog rejected our credentials for {what} ({status}): {detail}")
_forbidden = _Kind(
    PermissionDeniedError,
    "catalog refused access to {what} ({status} Forbidden: the principal lacks a grant, or the catalog "
    "does not trust this reader with read-restrictions): {detail}",
)
_no_namespace = _Kind(NoSuchNamespaceError, "{what}: namespace not found: {detail}")
_no_table = _Kind(NoSuchTableError, "{what} not found: {detail}")
_not_acceptable = _Kind(
    RestrictionsNotSupportedError,
    "catalog requires read-restrictions support for {what} ({status}): the client did not declare the "
    f"{vocabulary.READ_RESTRICTIONS_V1} capability (catalog.client_capabilities): {{detail}}",
)
_conflict = _Kind(CommitConflictError, "conflict on {what} ({status}): {detail}")
_unprocessable = _Kind(IntegrityError, "catalog rejected {what} as unprocessable ({status}, not retried): {detail}")
_unavailable = _Kind(CatalogUnavailableError, "catalog unavailable for {what} (HTTP {status}): {detail}")
_generic = _Kind(CatalogError, "catalog error for {what} (HTTP {status}): {detail}")


_BY_TYPE: dict[str, _Kind] = {
    vocabulary.ERROR_NOT_AUTHORIZED: _unauthorized,
    vocabulary.ERROR_FORBIDDEN: _forbidden,
    vocabulary.ERROR_NO_SUCH_NAMESPACE: _no_namespace,
    vocabulary.ERROR_NO_SUCH_TABLE: _no_table,
    vocabulary.ERROR_NO_SUCH_VIEW: _no_table,
    vocabulary.ERROR_NOT_ACCEPTABLE: _not_acceptable,
    vocabulary.ERROR_ALREADY_EXISTS: _conflict,
    vocabulary.ERROR_COMMIT_FAILED: _conflict,
    vocabulary.ERROR_UNPROCESSABLE: _unprocessable,
    vocabulary.ERROR_SERVICE_UNAVAILABLE: _unavailable,
}

_BY_STATUS: dict[int, _Kind] = {
    401: _unauthorized,
    403: _forbidden,
    404: _no_table,  # a load or commit names a table; a typed catalog says when it is the namespace
    406: _not_acceptable,
    409: _conflict,
    422: _unprocessable,
    429: _unavailable,
}


def catalog_error(status: int, error_type: str | None, detail: str, what: str) -> CatalogError:
    """The SQE error for a catalog answer: by ErrorModel ``type`` when known, else by HTTP status."""
    typed = typed_catalog_error(status, error_type, detail, what)
    if typed is not None:
        return typed
    kind = _BY_STATUS.get(status) or (_unavailable if status >= 500 else _generic)
    return kind.build(what, detail, status)


def typed_catalog_error(status: int, error_type: str | None, detail: str, what: str) -> CatalogError | None:
    """The SQE error an ErrorModel ``type`` names, or None when this translator does not know the type (an
    ErrorModel inside a successful answer, such as a failed scan plan, then keeps its caller's own error)."""
    kind = _BY_TYPE.get(error_type or "")
    return None if kind is None else kind.build(what, detail, status)


def error_for_status(response: requests.Response, what: str) -> CatalogError:
    """Map an HTTP error answer to SQE's typed errors (clear messages, no secrets: not even the bearer token the
    request carried, should the catalog or a proxy quote it)."""
    error_type, detail = _error_model(response)
    return catalog_error(response.status_code, error_type, detail, what)


# Without an HTTP answer, pyiceberg's exception class stands in for the ErrorModel type.
_PYICEBERG_TYPES: tuple[tuple[type[Exception] | tuple[type[Exception], ...], int, str], ...] = (
    (UnauthorizedError, 401, vocabulary.ERROR_NOT_AUTHORIZED),
    (ForbiddenError, 403, vocabulary.ERROR_FORBIDDEN),
    (PyNoSuchTableError, 404, vocabulary.ERROR_NO_SUCH_TABLE),
    (PyNoSuchNamespaceError, 404, vocabulary.ERROR_NO_SUCH_NAMESPACE),
    (
        (CommitFailedException, TableAlreadyExistsError, NamespaceAlreadyExistsError),
        409,
        vocabulary.ERROR_COMMIT_FAILED,
    ),
)


def translate_error(exc: Exception, what: str) -> CatalogError:
    """Map pyiceberg's REST exceptions (raised by its own calls such as commits) to SQE's tree.

    pyiceberg raises them from the ``HTTPError`` that carries the answer: the answer is translated then. Without
    one (pyiceberg decided on its own), the exception class stands in for the ErrorModel type.
    """
    cause = exc.__cause__
    if isinstance(exc, CommitStateUnknownException):  # pyiceberg's name for a commit's 500, 502 or 504
        response = cause.response if isinstance(cause, requests.HTTPError) else None
        status = response.status_code if response is not None else None
        # pyiceberg's message quotes the answer (its ErrorModel message, or a non-JSON body whole): the token the
        # request carried is blanked out as error_for_status does.
        detail = first_line(_without(str(exc), _bearer_token_sent(response)) if response is not None else exc)
        return commit_state_unknown(what, f"HTTP {status}: {detail}" if status else detail, status)
    if isinstance(cause, requests.HTTPError) and cause.response is not None:
        return error_for_status(cause.response, what)
    message = first_line(exc)
    for kinds, status, error_type in _PYICEBERG_TYPES:
        if isinstance(exc, kinds):
            return catalog_error(status, error_type, message, what)
    return CatalogError(f"catalog error for {what}: {message}")


def commit_state_unknown(what: str, detail: str, status: int | None = None) -> CommitStateUnknownError:
    """A commit whose outcome no answer told: ``what`` names it, ``detail`` is what happened instead."""
    return CommitStateUnknownError(
        f"outcome of {what} unknown ({detail}): it may have landed; check the table's snapshots before running "
        "the statement again",
        status,
    )


def _error_model(response: requests.Response) -> tuple[str | None, str]:
    """(ErrorModel ``type`` or None, one-line message) of an error answer; the body's first line otherwise."""
    sent = _bearer_token_sent(response)
    try:
        body: Any = response.json()
        error = body["error"]
        message = first_line(_without(str(error["message"]), sent), limit=500)
    except (ValueError, KeyError, TypeError):
        text = _without(response.text or response.reason, sent)
        return None, first_line(text, limit=200) if text and text.strip() else "no details"
    error_type = error.get("type") if isinstance(error, dict) else None
    return (error_type if isinstance(error_type, str) else None), message


def without_bearer_token_sent(answer: dict[str, Any], response: requests.Response) -> dict[str, Any]:
    """A successful ``answer`` whose ErrorModel (a failed scan plan) has the request's bearer token blanked out of
    its message, as an error answer's is: the message becomes an error the user sees."""
    error = answer.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        error["message"] = _without(error["message"], _bearer_token_sent(response))
    return answer


def _bearer_token_sent(response: requests.Response) -> str:
    """The bearer token of the request ``response`` answers ("" without one). In ``sqe serve`` it is a delegated
    token: a user who read it in an error could take it to the catalog and get raw credentials of tables that
    carry read-restrictions for them, bypassing the server that enforces them."""
    request = getattr(response, "request", None)
    header = request.headers.get("Authorization", "") if request is not None else ""
    scheme, _, token = str(header).partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _without(text: str, secret: str) -> str:
    """``text`` with ``secret`` and any long piece of it blanked out (a catalog may quote it cut short), before any
    cut of ours (a cut could leave part of it). Text past what any message shows goes first: the search for pieces
    reads every character."""
    return without_secrets(text[:MAX_MESSAGE_CHARS], [secret]) if secret else text
