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
        └── ClaimContendedError        a create that kept losing its claim of places (``Retry-After``)

Messages are written for the client: they never contain secrets or stack traces.
"""

from __future__ import annotations

from typing import Any, ClassVar, Self, TypeVar

from sqe import vocabulary
from sqe._text import escape_unprintable, first_line, redacted_message
from sqe.vocabulary import ERROR_METADATA_INTEGRITY

_Found = TypeVar("_Found")


class CatalogError(Exception):
    """A generic server error. A subclass names its HTTP status and ErrorModel type in its class line
    (``class X(CatalogError, status=400, error_type=...)``); what it leaves out it inherits."""

    status: ClassVar[int] = 500
    error_type: ClassVar[str] = vocabulary.ERROR_SERVER

    def __init_subclass__(cls, *, status: int | None = None, error_type: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
        if error_type is not None:
            cls.error_type = error_type

    def __init__(self, message: str) -> None:
        # A message may quote a location or header a client sent: the password goes here, once, so ``message``,
        # ``str``, the ErrorModel and any log line all show the same redacted text, cut to MAX_MESSAGE_CHARS
        # first (a message may quote a client's megabytes: redacting them all cost seconds of CPU).
        message = redacted_message(message)
        super().__init__(message)
        self.message = message

    def to_json(self) -> dict[str, Any]:
        # Messages may echo client input (a path segment, a key): escaped, so the ErrorModel stays one line.
        message = escape_unprintable(self.message)
        return {"error": {"message": message, "type": self.error_type, "code": self.status}}

    def headers(self) -> dict[str, str]:
        """HTTP headers the response carrying this error adds (none unless a subclass says)."""
        return {}


class BadRequestError(CatalogError, status=400, error_type=vocabulary.ERROR_BAD_REQUEST):
    """Malformed JSON, bad identifiers, invalid arguments."""


class NotAuthorizedError(CatalogError, status=401, error_type=vocabulary.ERROR_NOT_AUTHORIZED):
    """A missing, expired or invalid bearer token, or a bad client secret."""

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class ForbiddenError(CatalogError, status=403, error_type=vocabulary.ERROR_FORBIDDEN):
    """Authenticated, but lacking a grant."""


class NotFoundError(CatalogError, status=404, error_type=vocabulary.ERROR_NOT_FOUND):
    """The named object does not exist; subclasses name which kind."""

    kind: ClassVar[str] = "object"

    @classmethod
    def named(cls, *parts: str) -> Self:
        """This error for the object whose name is ``parts`` (``table does not exist: ns.t``): one wording."""
        return cls(f"{cls.kind} does not exist: {'.'.join(parts)}")

    @classmethod
    def unless_found(cls, found: _Found | None, *parts: str) -> _Found:
        """``found``, the result of looking ``parts`` up; this error when the lookup found nothing."""
        if found is None:
            raise cls.named(*parts)
        return found


class NoSuchNamespaceError(NotFoundError, error_type=vocabulary.ERROR_NO_SUCH_NAMESPACE):
    kind = "namespace"


class NoSuchTableError(NotFoundError, error_type=vocabulary.ERROR_NO_SUCH_TABLE):
    kind = "table"


class NoSuchPrincipalError(NotFoundError, error_type=vocabulary.ERROR_NO_SUCH_PRINCIPAL):
    pass


class NotAcceptableError(CatalogError, status=406, error_type=vocabulary.ERROR_NOT_ACCEPTABLE):
    """E.g. restrictions apply but the client did not declare that it supports them."""


class AlreadyExistsError(CatalogError, status=409, error_type=vocabulary.ERROR_ALREADY_EXISTS):
    pass


class CommitFailedError(CatalogError, status=409, error_type=vocabulary.ERROR_COMMIT_FAILED):
    """Optimistic-concurrency loss or a failed commit requirement."""


class ClaimRaced(CommitFailedError):
    """A claim of places whose checks another catalog process's claim committed behind: its transaction rolled
    back, nothing was recorded, and the claim is checked and made again (``WarehouseTables``)."""


class UnprocessableEntityError(CatalogError, status=422, error_type=vocabulary.ERROR_UNPROCESSABLE):
    pass


class MetadataIntegrityError(UnprocessableEntityError, error_type=ERROR_METADATA_INTEGRITY):
    """Stored or candidate metadata contradicts the table's trusted state (``sqe_catalog.integrity``).

    422, not 5xx: the verdict does not change on retry, so clients must not retry it."""


class ServiceUnavailableError(CatalogError, status=503, error_type=vocabulary.ERROR_SERVICE_UNAVAILABLE):
    """E.g. the STS endpoint cannot be reached."""


class ClaimContendedError(ServiceUnavailableError):
    """A create (create, stage-create, register, view create, notification) whose claim of places kept losing to
    other catalog processes' claims: nothing was written. 503 with ``Retry-After``, not 409: on those routes the
    Iceberg REST clients read 409 as "already exists". Iceberg's Java HTTP client retries a 503 by itself (after
    ``Retry-After``). Commits answer ``CommitFailedError`` instead: a 5xx there reads as "commit state unknown"."""

    RETRY_AFTER_SECONDS: ClassVar[int] = 1

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.RETRY_AFTER_SECONDS)}


class ConfigError(Exception):
    """Invalid catalog configuration file; raised at start-up, names the offending key."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redacted_message(arg) if isinstance(arg, str) else arg for arg in args))


def describe_database_error(exc: Exception) -> str:
    """A database failure as its driver's first line, never SQLAlchemy's rendering of it (which may echo the
    statement and its bound parameters)."""
    orig = getattr(exc, "orig", None)
    return first_line(orig) if orig is not None else type(exc).__name__
