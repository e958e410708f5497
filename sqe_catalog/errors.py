"""The catalog's exception tree. Every error reaches the client as the Iceberg REST ``ErrorModel``.

    CatalogError (500, generic server error)
    ├── BadRequestError (400)          malformed JSON, bad identifiers, invalid arguments
    ├── NotAuthorizedError (401)       missing/expired/invalid bearer token, bad client secret
    ├── ForbiddenError (403)           authenticated but lacking a grant
    ├── NotFoundError (404)
    │   ├── NoSuchNamespaceError
    │   ├── NoSuchTableError
    │   └── NoSuchPrincipalError
    ├── NotAcceptableError (406)       e.g. restrictions apply but the client did not declare support
    ├── AlreadyExistsError (409)
    ├── CommitFailedError (409)        optimistic-concurrency loss or failed requirement
    ├── UnprocessableEntityError (422)
    │   └── MetadataIntegrityError     key-ID pin or metadata digest does not hold (never retried)
    └── ServiceUnavailableError (503)  e.g. the STS endpoint cannot be reached

Messages are written for the client: they never contain secrets or stack traces.
"""

from __future__ import annotations

from typing import Any, ClassVar

from sqe import vocabulary
from sqe._text import escape_unprintable
from sqe.vocabulary import ERROR_METADATA_INTEGRITY


class CatalogError(Exception):
    status: ClassVar[int] = 500
    error_type: ClassVar[str] = vocabulary.ERROR_SERVER

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_json(self) -> dict[str, Any]:
        # Messages may echo client input (a path segment, a key): escaped, so the ErrorModel stays one line.
        message = escape_unprintable(self.message)
        return {"error": {"message": message, "type": self.error_type, "code": self.status}}


class BadRequestError(CatalogError):
    status = 400
    error_type = vocabulary.ERROR_BAD_REQUEST


class NotAuthorizedError(CatalogError):
    status = 401
    error_type = vocabulary.ERROR_NOT_AUTHORIZED


class ForbiddenError(CatalogError):
    status = 403
    error_type = vocabulary.ERROR_FORBIDDEN


class NotFoundError(CatalogError):
    status = 404
    error_type = vocabulary.ERROR_NOT_FOUND


class NoSuchNamespaceError(NotFoundError):
    error_type = vocabulary.ERROR_NO_SUCH_NAMESPACE


class NoSuchTableError(NotFoundError):
    error_type = vocabulary.ERROR_NO_SUCH_TABLE


class NoSuchPrincipalError(NotFoundError):
    error_type = vocabulary.ERROR_NO_SUCH_PRINCIPAL


class NotAcceptableError(CatalogError):
    status = 406
    error_type = vocabulary.ERROR_NOT_ACCEPTABLE


class AlreadyExistsError(CatalogError):
    status = 409
    error_type = vocabulary.ERROR_ALREADY_EXISTS


class CommitFailedError(CatalogError):
    status = 409
    error_type = vocabulary.ERROR_COMMIT_FAILED


class UnprocessableEntityError(CatalogError):
    status = 422
    error_type = vocabulary.ERROR_UNPROCESSABLE


class MetadataIntegrityError(UnprocessableEntityError):
    """Stored or candidate metadata contradicts the table's trusted state (``sqe_catalog.integrity``).

    422, not 5xx: the verdict does not change on retry, so clients must not retry it."""

    error_type = ERROR_METADATA_INTEGRITY


class ServiceUnavailableError(CatalogError):
    status = 503
    error_type = vocabulary.ERROR_SERVICE_UNAVAILABLE


class ConfigError(Exception):
    """Invalid catalog configuration file; raised at start-up, names the offending key."""
